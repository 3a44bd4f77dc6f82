// Syntax highlighting of code blocks: highlight.js's core with the languages models write most (the full
// build would add some 900 KB to the bundle). A fence that names no language, or one not registered here,
// stays plain: guessing would run on every streamed token and is often wrong.

import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import cpp from 'highlight.js/lib/languages/cpp';
import css from 'highlight.js/lib/languages/css';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import markdown from 'highlight.js/lib/languages/markdown';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import shell from 'highlight.js/lib/languages/shell';
import sql from 'highlight.js/lib/languages/sql';
import swift from 'highlight.js/lib/languages/swift';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';

const LANGUAGES = { bash, c, cpp, css, diff, go, javascript, json, markdown, python, rust, shell, sql, swift, typescript, xml, yaml };
for (const [name, lang] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, lang);
// Names models put on fences that the grammars above do not declare themselves.
hljs.registerAliases(['sh', 'zsh', 'console'], { languageName: 'bash' });
hljs.registerAliases(['jsonc', 'json5'], { languageName: 'json' });
hljs.registerAliases(['svg'], { languageName: 'xml' });
const LANGUAGES_BY_GRAMMAR = new Map(Object.keys(LANGUAGES).map((name) => [hljs.getLanguage(name), name]));

export interface Highlighted {
  /** highlight.js's HTML: the code's text escaped, inside `<span class="hljs-…">` only. */
  html: string;
  /** The language's own name (`ts` gives `typescript`). */
  language: string;
}

/** The fence's language word ("```ts title=x" gives "ts"), lowercased. */
export function fenceLanguage(info: string | undefined): string {
  return (info ?? '').trim().split(/\s+/)[0]?.toLowerCase() ?? '';
}

/** `code` highlighted as `lang` (a name or alias), or null when that language is not registered here. */
export function highlight(code: string, lang: string): Highlighted | null {
  const grammar = lang ? hljs.getLanguage(lang) : undefined;
  if (!grammar) return null;
  const name = LANGUAGES_BY_GRAMMAR.get(grammar) ?? lang;
  return { html: hljs.highlight(code, { language: lang, ignoreIllegals: true }).value, language: name };
}

/**
 * The classes highlight.js writes: `hljs`, `hljs-keyword`, `language-rust`, and its sub-scopes such as
 * `function_` in `hljs-title function_`; at least one `hljs` among them. Only these survive the sanitiser
 * (markdown.ts): harmless even when a model writes them itself, since they only colour text.
 */
export function isHighlightClass(value: string): boolean {
  const tokens = value.trim().split(/\s+/);
  return tokens.length > 0 && tokens.every((t) => /^(hljs(-[a-z0-9_-]+)?|language-[a-z0-9+#-]+|[a-z]+_+)$/i.test(t)) && /(^|\s)hljs(-|\s|$)/.test(value);
}
