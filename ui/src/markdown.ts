// Markdown of model output -> sanitised HTML. marked parses (GitHub-flavoured); DOMPurify then removes
// anything that could run script or reach the network: <script>, event handlers, javascript: URLs,
// forms and frames, and images other than inline data: images. Code blocks are highlighted (highlight.ts)
// before sanitising; the only classes kept are highlight.js's own.

import DOMPurify from 'dompurify';
import { Marked } from 'marked';
import { fenceLanguage, highlight, isHighlightClass } from './highlight';

const marked = new Marked({ gfm: true, breaks: false, async: false });
marked.use({
  renderer: {
    code({ text, lang }) {
      const lit = highlight(text.replace(/\n$/, ''), fenceLanguage(lang));
      // false: marked's own (escaped, plain) block.
      return lit ? `<pre><code class="hljs language-${lit.language}">${lit.html}\n</code></pre>\n` : false;
    },
  },
});

let purifier: ReturnType<typeof DOMPurify> | null = null;

function getPurifier(): ReturnType<typeof DOMPurify> {
  if (purifier) return purifier;
  const p = DOMPurify(window);
  // `class` is forbidden (model output must not borrow the app's styles) except highlight.js's on code.
  p.addHook('uponSanitizeAttribute', (node, data) => {
    if (data.attrName === 'class' && (node.tagName === 'SPAN' || node.tagName === 'CODE') && isHighlightClass(data.attrValue)) {
      data.forceKeepAttr = true;
    }
  });
  p.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A') {
      const href = node.getAttribute('href') ?? '';
      if (/^\s*#/.test(href)) return;
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    } else if (node.tagName === 'IMG') {
      const src = node.getAttribute('src') ?? '';
      if (!/^data:image\/(png|jpe?g|gif|webp);/i.test(src)) {
        // An offline app fetches nothing on a model's say-so: keep the alt text only.
        const alt = node.getAttribute('alt') ?? '';
        node.replaceWith(document.createTextNode(alt ? `[image: ${alt}]` : '[image]'));
      }
    }
  });
  purifier = p;
  return p;
}

const FORBID_TAGS = ['style', 'form', 'input', 'button', 'textarea', 'select', 'option', 'iframe', 'frame', 'object', 'embed', 'link', 'meta', 'base', 'svg', 'math'];

/** Sanitises HTML for insertion with innerHTML. */
export function sanitize(html: string): string {
  return getPurifier().sanitize(html, {
    USE_PROFILES: { html: true },
    FORBID_TAGS,
    FORBID_ATTR: ['style', 'class', 'id'],
    ALLOW_DATA_ATTR: false,
  });
}

/** Renders markdown to sanitised HTML. */
export function renderMarkdown(text: string): string {
  const html = marked.parse(text, { async: false }) as string;
  return sanitize(html);
}

/** A reply split into its `<think>…</think>` part (Qwen's reasoning) and its answer. */
export interface SplitReply {
  thinking: string | null;
  /** The closing tag was seen (the reasoning is complete). */
  thinkingDone: boolean;
  answer: string;
}

export function splitThinking(text: string): SplitReply {
  const open = text.match(/^\s*<think>/);
  if (!open) {
    // Some templates open the think block in the prompt: the reply then starts inside it.
    const close = text.indexOf('</think>');
    if (close >= 0 && !text.slice(0, close).includes('<think>')) {
      return { thinking: text.slice(0, close).trim(), thinkingDone: true, answer: text.slice(close + 8).replace(/^\s+/, '') };
    }
    return { thinking: null, thinkingDone: false, answer: text };
  }
  const rest = text.slice(open[0].length);
  const close = rest.indexOf('</think>');
  if (close < 0) return { thinking: rest.trim(), thinkingDone: false, answer: '' };
  return { thinking: rest.slice(0, close).trim(), thinkingDone: true, answer: rest.slice(close + 8).replace(/^\s+/, '') };
}
