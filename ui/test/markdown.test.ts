import { describe, expect, it } from 'vitest';
import { renderMarkdown, sanitize, splitThinking } from '../src/markdown';

function dom(html: string): HTMLElement {
  const div = document.createElement('div');
  div.innerHTML = html;
  return div;
}

describe('renderMarkdown', () => {
  it('renders GitHub-flavoured markdown', () => {
    const d = dom(renderMarkdown('# Title\n\n**bold** and `code`\n\n```js\nlet x = 1 < 2;\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- one\n- two'));
    expect(d.querySelector('h1')?.textContent).toBe('Title');
    expect(d.querySelector('strong')?.textContent).toBe('bold');
    expect(d.querySelector('pre code')?.textContent).toBe('let x = 1 < 2;\n');
    expect(d.querySelectorAll('td')).toHaveLength(2);
    expect(d.querySelectorAll('li')).toHaveLength(2);
  });

  it('strips <script>, event handlers and javascript: URLs from model output', () => {
    const payload = [
      'Hello <script>window.__pwned = 1</script>',
      '<img src=x onerror="window.__pwned = 2">',
      '<a href="javascript:alert(1)">click</a>',
      '[md link](javascript:alert(3))',
      '<div onclick="alert(4)" style="position:fixed">box</div>',
      '<iframe src="https://example.com"></iframe>',
      '<svg><script>alert(5)</script></svg>',
    ].join('\n\n');
    const html = renderMarkdown(payload);
    const d = dom(html);
    expect(d.querySelector('script, iframe, svg')).toBeNull();
    expect(d.querySelector('[onerror], [onclick], [style]')).toBeNull();
    expect(html).not.toMatch(/onerror|onclick|javascript:/i);
    for (const a of d.querySelectorAll('a')) expect(a.getAttribute('href') ?? '').not.toMatch(/^javascript:/i);
    expect(d.textContent).toContain('Hello');
    expect(d.textContent).toContain('box');
    expect((window as { __pwned?: number }).__pwned).toBeUndefined();
  });

  it('fetches nothing: remote images become their alt text; inline data images stay', () => {
    const d = dom(renderMarkdown('![a cat](https://example.com/cat.png) ![dot](data:image/png;base64,iVBORw0KGgo=)'));
    const imgs = d.querySelectorAll('img');
    expect(imgs).toHaveLength(1);
    expect(imgs[0]!.getAttribute('src')).toMatch(/^data:image\/png/);
    expect(d.textContent).toContain('[image: a cat]');
  });

  it('opens links outside the app window', () => {
    const a = dom(renderMarkdown('[docs](https://example.com/docs)')).querySelector('a')!;
    expect(a.getAttribute('target')).toBe('_blank');
    expect(a.getAttribute('rel')).toBe('noopener noreferrer');
  });

  it('sanitize() alone removes a handler payload', () => {
    expect(sanitize('<img src="data:image/png;base64,AA" onerror="alert(1)"><b onmouseover="x()">b</b>')).not.toMatch(/on(error|mouseover)/);
  });
});

describe('code highlighting', () => {
  const spanOf = (d: HTMLElement, text: string) => [...d.querySelectorAll('pre code span')].find((s) => s.textContent === text);

  it('colours a fenced block of a known language, keeping its text as written', () => {
    const code = 'fn main() {\n    let s = "hi"; // greet\n}';
    const d = dom(renderMarkdown('```rust\n' + code + '\n```'));
    const block = d.querySelector('pre code')!;
    expect(block.textContent).toBe(code + '\n');
    expect(block.className).toMatch(/\blanguage-rust\b/);
    const keyword = spanOf(d, 'fn')!;
    const string = spanOf(d, '"hi"')!;
    const comment = spanOf(d, '// greet')!;
    for (const s of [keyword, string, comment]) expect(s.className).toMatch(/^hljs-/);
    expect(new Set([keyword.className, string.className, comment.className]).size).toBe(3);
  });

  it('knows the names models put on fences (ts, sh, py, yml, html)', () => {
    for (const [fence, code] of [
      ['ts', 'const x: number = 1;'],
      ['sh', 'echo "$HOME"'],
      ['py', 'def f(): return 1'],
      ['yml', 'key: value'],
      ['html', '<p class="a">x</p>'],
      ['json', '{"a": 1}'],
    ]) {
      const d = dom(renderMarkdown('```' + fence + '\n' + code + '\n```'));
      expect(d.querySelector('pre code')!.textContent, fence).toBe(code + '\n');
      expect(d.querySelectorAll('pre code span[class^="hljs-"]').length, fence).toBeGreaterThan(0);
    }
  });

  it('leaves a block without a language, or with one it does not know, plain', () => {
    for (const md of ['```\nfn main() {}\n```', '```brainfuck\n+[-->-[>>+>-----<<]<--<---]>-.\n```']) {
      const d = dom(renderMarkdown(md));
      expect(d.querySelector('pre code')).not.toBeNull();
      expect(d.querySelector('pre code span, [class]')).toBeNull();
    }
  });

  it('stays sanitised: code cannot break out of its block, and only highlight.js classes survive', () => {
    const html = renderMarkdown(
      [
        '```js\n</code></pre><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">\n```',
        '<span class="hljs-keyword" onclick="alert(1)">k</span>',
        '<span class="error-banner">mimic</span> <span class="hljs-string app-style">mixed</span> <div class="hljs">div</div>',
      ].join('\n\n'),
    );
    const d = dom(html);
    expect(d.querySelector('script, img, [onclick], [onerror]')).toBeNull();
    expect(d.querySelector('pre code')!.textContent).toContain('<script>window.__pwned = 1</script>');
    expect(d.querySelector('.error-banner, .app-style, div[class]')).toBeNull();
    const span = (text: string) => [...d.querySelectorAll('span')].find((s) => s.textContent === text)!;
    expect(span('k').className).toBe('hljs-keyword');
    expect(span('mixed').hasAttribute('class')).toBe(false);
    expect((window as { __pwned?: number }).__pwned).toBeUndefined();
  });
});

describe('splitThinking', () => {
  it('splits a finished <think> block from the answer', () => {
    expect(splitThinking('<think>\nplan it\n</think>\n\nThe answer.')).toEqual({ thinking: 'plan it', thinkingDone: true, answer: 'The answer.' });
  });
  it('sees a block still open while streaming', () => {
    expect(splitThinking('<think>still going')).toEqual({ thinking: 'still going', thinkingDone: false, answer: '' });
  });
  it('handles a reply that starts inside a block opened by the template', () => {
    expect(splitThinking('reasoning</think>answer')).toEqual({ thinking: 'reasoning', thinkingDone: true, answer: 'answer' });
  });
  it('leaves plain replies alone', () => {
    expect(splitThinking('just text')).toEqual({ thinking: null, thinkingDone: false, answer: 'just text' });
  });
});
