// Browser end-to-end tests of the web UI against a real `tandem serve` (started by run.sh with a
// throwaway models.toml), in Debian's Chromium driven by playwright-core. Every wait is bounded.
//
// What they prove, through the UI only:
//  1. the page loads from the server and sees the engine online;
//  2. a chat answer streams in (the message grows over several renders) and the live panel's
//     tok/s and MTP acceptance change from "—" to measured values;
//  3. that chat survives a page reload, and the engine keeps it (the API and the file in the
//     conversations folder), not the page's localStorage;
//  4. a model unloads and loads from Models;
//  5. the bundled model converts to 4-bit from the Convert view, lands in models_dir, is listed
//     under Models as a 4-bit MLX model, and loads;
//  6. a folder that is not a model is refused with a message that names it;
//  7. the desktop shell's drop hook (`window.onFolderDropped`, the `tandem://dropped-folder` event)
//     opens Convert with the path;
//  8. an image for a text-only model blocks Send (with the reason) until it is removed, and a chat
//     already holding one recovers by removing it (no chat is poisoned); single messages delete;
//  9. a chat deleted while its reply streams stays deleted after a reload;
// 10. at 720 px wide the conversation list, New chat and the Stats drawer are usable;
// 11. converting onto an existing name offers Replace / another name, never an API hint;
// 12. a chat is renamed, searched, exported (JSON, Markdown), deleted and undone, and imported;
// 13. a new chat does not inherit the last one's settings; an edited message regenerates; versions switch;
// 13b. code in an answer is highlighted and copied ("Copied", then gone); the app's context menu copies, edits
//     and closes with Escape or a click outside; ?, Ctrl+Shift+M, / and Ctrl+Shift+O do what they say;
// 14. a model folder outside the models folder converts where it lies once the person allows it (nothing
//     written beside it), and an existing model folder is added under Models without converting it;
// 15. a model downloads from (a mock of) the Hugging Face Hub on the Download page, is converted to 4-bit
//     with its MTP head from there, and answers a chat with MTP: repo to chat through the UI alone;
// 16. the Download page's search finds a head-less MLX conversion on the Hub (beside the catalogue), its
//     preview says it fits and lacks the head, and after its download "Get its MTP head" grafts the head of
//     its base onto a new model whose MTP runs.
// 17. Settings switches the whole window to the dark theme at once (saved in models.toml), and shows the
//     server's address and its request log.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const URL = process.env.TANDEM_URL;
const WORK = process.env.TANDEM_E2E_WORK;
const TINY = process.env.TANDEM_TINY;
const SHOTS = process.env.SCREENSHOTS ?? 'target/e2e';
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
if (!URL || !WORK || !TINY) throw new Error('run through tests/e2e/run.sh (TANDEM_URL, TANDEM_E2E_WORK, TANDEM_TINY)');

const SHORT = 15_000; // UI reactions
const GENERATION = 120_000; // loading the model and answering on a busy CPU
const CONVERSION = 300_000;

let context;
let page;
let profile;
const consoleErrors = [];

const byId = (id) => page.getByTestId(id);
const shot = (name) => page.screenshot({ path: path.join(SHOTS, name), fullPage: false });

before(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-e2e-chromium-'));
  // A fresh profile per run; the flags keep Chromium off the network (none is reachable here).
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 900 },
    timeout: 60_000,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--disable-quic',
      '--no-first-run',
    ],
  });
  context.setDefaultTimeout(SHORT);
  page = context.pages()[0] ?? (await context.newPage());
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(URL, { waitUntil: 'load', timeout: 30_000 });
});

after(async () => {
  if (consoleErrors.length) console.log(`browser console errors:\n  ${consoleErrors.join('\n  ')}`);
  await context?.close();
  if (profile) fs.rmSync(profile, { recursive: true, force: true });
});

/** The model row of `id` on the Models view. */
const modelRow = (id) => page.locator(`[data-testid="model-row"][data-model-id="${id}"]`);

async function openModels() {
  await byId('nav-models').click();
  await byId('model-list').waitFor();
}

describe('Tandem web UI against tandem serve', () => {
  test('the UI loads from the server and sees the engine online', async () => {
    assert.match(await page.title(), /Tandem/);
    await page.locator('[data-testid="health-status"][data-online="true"]').waitFor();
    await byId('live-panel').waitFor();
    assert.equal(await byId('engine-offline').count(), 0);
    await shot('01-start.png');
  });

  test('a chat answer streams in and the live panel shows tok/s and acceptance', async () => {
    await byId('nav-chat').click();
    await byId('new-chat').click();
    const picker = byId('chat-model-picker');
    await picker.waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid="chat-model-picker"]')?.value === 'tandem-tiny', null, { timeout: SHORT });
    const before = {
      tokS: (await byId('panel-tok-s').innerText()).trim(),
      acceptance: (await byId('panel-acceptance').innerText()).trim(),
    };

    // Record every text the answer shows while it streams, and every tok/s the panel shows.
    await page.evaluate(() => {
      const seen = { contents: [], tokS: [] };
      window.__e2e = seen;
      const observer = new MutationObserver(() => {
        const answers = document.querySelectorAll('[data-testid="message-assistant"]');
        const last = answers[answers.length - 1];
        const text = last?.querySelector('[data-testid="message-content"]')?.textContent ?? '';
        if (text && seen.contents[seen.contents.length - 1] !== text) seen.contents.push(text);
        const tokS = document.querySelector('[data-testid="panel-tok-s"]')?.textContent ?? '';
        if (seen.tokS[seen.tokS.length - 1] !== tokS) seen.tokS.push(tokS);
      });
      observer.observe(document.body, { subtree: true, childList: true, characterData: true });
    });

    await byId('chat-input').fill('Tell me a long story about two bicycles riding together through the hills.');
    await byId('chat-send').click();
    await byId('message-user').last().waitFor();
    const answer = byId('message-assistant').last();
    await answer.waitFor();
    await page.locator('[data-testid="message-assistant"][data-streaming="true"]').waitFor({ timeout: GENERATION }).catch(() => {});
    await page.locator('[data-testid="message-assistant"][data-streaming="false"]').last().waitFor({ timeout: GENERATION });
    assert.equal(await byId('message-error').count(), 0, 'the answer ended without an error');
    const text = (await answer.getByTestId('message-content').innerText()).trim();
    assert.ok(text.length > 0, 'the answer has text');

    const seen = await page.evaluate(() => window.__e2e);
    assert.ok(seen.contents.length >= 3, `the answer grew over several renders (saw ${seen.contents.length})`);
    for (let i = 1; i < seen.contents.length; i++) {
      assert.ok(seen.contents[i].length >= seen.contents[i - 1].length, 'streamed text only grows');
    }

    // The live panel's figures: from "—" to measured values.
    await page.waitForFunction(
      () => /\d/.test(document.querySelector('[data-testid="panel-acceptance"]')?.textContent ?? ''),
      null,
      { timeout: SHORT },
    );
    const afterTokS = (await byId('panel-tok-s').innerText()).trim();
    const afterAcceptance = (await byId('panel-acceptance').innerText()).trim();
    assert.notEqual(afterTokS, before.tokS, 'tok/s changed');
    assert.notEqual(afterAcceptance, before.acceptance, 'acceptance changed');
    assert.ok(parseFloat(afterTokS.replace(/[^\d.]/g, '')) > 0, `tok/s is a positive number: ${afterTokS}`);
    const acceptance = parseFloat(afterAcceptance);
    assert.ok(acceptance >= 0 && acceptance <= 100 && /%/.test(afterAcceptance), `acceptance is a percentage: ${afterAcceptance}`);
    assert.ok(seen.tokS.some((t) => /\d/.test(t)), 'the panel showed tok/s');
    await byId('message-stats').last().waitFor();
    console.log(`answer: ${text.length} chars over ${seen.contents.length} renders; tok/s ${before.tokS} -> ${afterTokS} (seen ${seen.tokS.join(' | ')}); acceptance ${before.acceptance} -> ${afterAcceptance}`);
    await shot('02-chat.png');
  });

  test('the chat survives a page reload and is kept by the engine', async () => {
    const active = page.locator('[data-testid="conversation-item"].active');
    await active.waitFor();
    const id = await active.getAttribute('data-conversation-id');
    assert.ok(id, 'the chat is in the conversation list');
    const answer = (await byId('message-assistant').last().getByTestId('message-content').innerText()).trim();

    await page.reload({ waitUntil: 'load', timeout: 30_000 });
    await page.locator('[data-testid="health-status"][data-online="true"]').waitFor();
    // The newest conversation opens at start: this one, with its answer.
    await page.locator(`[data-testid="conversation-item"].active[data-conversation-id="${id}"]`).waitFor();
    await byId('message-user').first().waitFor();
    const again = (await byId('message-assistant').last().getByTestId('message-content').innerText()).trim();
    assert.equal(again, answer, 'the answer is shown again after the reload');

    // The engine has it: listed, readable, and a file in the conversations folder.
    const list = await (await fetch(`${URL}/api/conversations`)).json();
    const summary = list.conversations.find((c) => c.id === id);
    assert.ok(summary, `GET /api/conversations lists ${id}: ${JSON.stringify(list)}`);
    assert.match(summary.title, /^Tell me a long story/);
    const res = await fetch(`${URL}/api/conversations/${id}`);
    assert.equal(res.status, 200);
    const saved = await res.json();
    assert.deepEqual(saved.messages.map((m) => m.role), ['user', 'assistant']);
    assert.match(saved.messages[0].content, /two bicycles/);
    assert.ok(saved.messages[1].content.length > 0 && saved.messages[1].stats, 'the answer is saved with its statistics');
    const file = path.join(WORK, 'conversations', `${id}.json`);
    assert.deepEqual(JSON.parse(fs.readFileSync(file, 'utf8')), saved, `${file} holds it`);
    // Not in the page's storage, which belongs to one origin (the desktop app's port may change).
    const local = await page.evaluate(() => Object.keys(localStorage).filter((k) => k.startsWith('tandem.conversation')));
    assert.deepEqual(local, []);
    await shot('02b-chat-after-reload.png');
  });

  test('an image for a text-only model blocks Send until removed, and a chat holding one recovers', async () => {
    await byId('nav-chat').click();
    await byId('new-chat').click();
    // A 1x1 PNG attached through the file picker.
    const png = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==', 'base64');
    await byId('chat-file-input').setInputFiles({ name: 'dot.png', mimeType: 'image/png', buffer: png });
    await byId('attachment-preview').waitFor();
    await byId('chat-input').fill('What is in this picture?');
    await byId('vision-warning').waitFor();
    assert.match(await byId('vision-warning').innerText(), /cannot take images/);
    assert.equal(await byId('chat-send').isDisabled(), true, 'Send is blocked while an image is attached');
    await shot('02c-image-blocked.png');
    await byId('attachment-remove').click();
    assert.equal(await byId('vision-warning').count(), 0);
    assert.equal(await byId('chat-send').isDisabled(), false);

    // A chat saved earlier with an image (as an older version let it happen): it opens with Send blocked,
    // and removing the image lets it go on.
    const id = `e2e-image-${Date.now()}`;
    const now = Date.now();
    const poisoned = {
      id, title: 'Poisoned by an image', created: now, updated: now + 60_000, model: 'tandem-tiny', sampling: {},
      messages: [
        { id: 'm1', role: 'user', content: 'Look', images: [`data:image/png;base64,${png.toString('base64')}`], created: now },
        { id: 'm2', role: 'assistant', content: '', error: 'remove the 1 image(s)', created: now },
      ],
    };
    const put = await fetch(`${URL}/api/conversations/${id}`, { method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(poisoned) });
    assert.ok(put.ok, `PUT the conversation: ${put.status}`);
    await page.reload({ waitUntil: 'load', timeout: 30_000 });
    await page.locator(`[data-testid="conversation-item"].active[data-conversation-id="${id}"]`).waitFor();
    await byId('message-image').waitFor();
    await byId('chat-input').fill('Just say hello.');
    assert.equal(await byId('chat-send').isDisabled(), true, 'Send is blocked while the chat holds an image');
    assert.match(await byId('vision-warning').innerText(), /already holds 1 image/);
    // The failed reply goes with its own Delete; the image with the warning's button.
    await byId('message-assistant').getByTestId('message-delete').click();
    assert.equal(await byId('message-assistant').count(), 0);
    await byId('chat-drop-images').click();
    assert.equal(await byId('message-image').count(), 0);
    await byId('chat-send').click();
    await page.locator('[data-testid="message-assistant"][data-streaming="false"]').last().waitFor({ timeout: GENERATION });
    assert.equal(await byId('message-error').count(), 0, `no error: ${await byId('message-error').allInnerTexts()}`);
    const saved = await (await fetch(`${URL}/api/conversations/${id}`)).json();
    assert.ok(!JSON.stringify(saved).includes('data:image'), 'the image is gone from the saved chat');
    assert.deepEqual(saved.messages.map((m) => m.role), ['user', 'user', 'assistant']);
    await byId('chat-context').waitFor();
    assert.match(await byId('chat-context').innerText(), /^[\d,]+ \/ [\d,]+ tokens$/);
  });

  test('a chat deleted while its reply streams stays deleted after a reload', async () => {
    await byId('new-chat').click();
    // A reply that streams for seconds: the bundled model ends a story within ~130 tokens (a fifth of a second on
    // this CPU, too short to see it streaming), but it counts on from a run of numbers until max_tokens.
    await byId('chat-settings-toggle').click();
    await byId('setting-max-tokens').fill('3000');
    await page.keyboard.press('Escape');
    await byId('chat-settings').waitFor({ state: 'detached' });
    await byId('chat-input').fill('1 2 3 4 5 6 7 8 9 10 11 12 13 14 15');
    await byId('chat-send').click();
    await page.locator('[data-testid="message-assistant"][data-streaming="true"]').waitFor({ timeout: GENERATION });
    const active = page.locator('[data-testid="conversation-item"].active');
    await active.waitFor();
    const id = await active.getAttribute('data-conversation-id');
    const streaming = await page.locator('[data-testid="message-assistant"][data-streaming="true"]').count();
    await active.hover();
    await active.getByTestId('conversation-delete').click();
    await byId('chat-send').waitFor({ timeout: GENERATION });
    assert.equal(streaming, 1, 'the reply was still streaming when its chat was deleted');
    await page.waitForTimeout(500);
    assert.equal((await fetch(`${URL}/api/conversations/${id}`)).status, 404, 'the engine does not have it');
    await page.reload({ waitUntil: 'load', timeout: 30_000 });
    await page.locator('[data-testid="health-status"][data-online="true"]').waitFor();
    await byId('conversation-list').waitFor();
    await page.waitForTimeout(500);
    assert.equal(await page.locator(`[data-testid="conversation-item"][data-conversation-id="${id}"]`).count(), 0, 'not listed after a reload');
    assert.ok(!fs.existsSync(path.join(WORK, 'conversations', `${id}.json`)), 'no file');
  });

  test('a chat is renamed, found, exported, deleted and brought back, and imported again', async () => {
    await byId('nav-chat').click();
    const item = page.locator('[data-testid="conversation-item"]').first();
    await item.locator('.conversation-open').click();
    const id = await item.getAttribute('data-conversation-id');
    const row = page.locator(`[data-testid="conversation-item"][data-conversation-id="${id}"]`);
    await row.hover();
    await row.getByTestId('conversation-rename').click();
    await byId('conversation-rename-input').fill('Renamed in e2e');
    await byId('conversation-rename-input').press('Enter');
    await row.locator('.conversation-open', { hasText: 'Renamed in e2e' }).waitFor();
    let title = '';
    for (let i = 0; i < 50 && title !== 'Renamed in e2e'; i++) {
      title = (await (await fetch(`${URL}/api/conversations/${id}`)).json()).title;
      if (title !== 'Renamed in e2e') await page.waitForTimeout(100);
    }
    assert.equal(title, 'Renamed in e2e', 'the engine keeps the new title');

    await byId('conversation-search').fill('renamed in');
    assert.equal(await byId('conversation-item').count(), 1);
    await byId('conversation-search').fill('');

    const [download] = await Promise.all([page.waitForEvent('download'), byId('chat-export-json').click()]);
    const file = path.join(WORK, 'export.json');
    await download.saveAs(file);
    const exported = JSON.parse(fs.readFileSync(file, 'utf8'));
    assert.equal(exported.id, id);
    assert.equal(exported.title, 'Renamed in e2e');
    const [md] = await Promise.all([page.waitForEvent('download'), byId('chat-export-md').click()]);
    assert.match(md.suggestedFilename(), /^Renamed-in-e2e\.md$/);

    await row.hover();
    await row.getByTestId('conversation-delete').click();
    await byId('conversation-undo').waitFor();
    await row.waitFor({ state: 'detached' });
    await byId('conversation-undo').click();
    await row.waitFor();
    assert.equal((await fetch(`${URL}/api/conversations/${id}`)).status, 200, 'back in the engine');

    const before = await byId('conversation-item').count();
    await byId('chat-import-input').setInputFiles(file);
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid="conversation-item"]').length === n + 1, before, { timeout: SHORT });
    assert.equal(await page.locator('[data-testid="conversation-item"] .conversation-open', { hasText: 'Renamed in e2e' }).count(), 2);
  });

  test("a new chat starts from the model's defaults; an edited message regenerates, keeping versions", async () => {
    await byId('nav-chat').click();
    await byId('new-chat').click();
    await byId('chat-settings-toggle').click();
    await byId('setting-max-tokens').fill('3000');
    assert.match(await byId('setting-temperature').getAttribute('placeholder'), /^default 0$/);
    await page.keyboard.press('Escape');
    await byId('chat-settings').waitFor({ state: 'detached' });
    await byId('new-chat').click();
    await byId('chat-settings-toggle').click();
    assert.equal(await byId('setting-max-tokens').inputValue(), '', 'the new chat does not inherit max_tokens');
    await page.keyboard.press('Escape');

    await byId('chat-input').fill('Name a colour.');
    await byId('chat-send').click();
    const idle = page.locator('[data-testid="message-assistant"][data-streaming="false"]');
    await idle.last().waitFor({ timeout: GENERATION });
    assert.equal(await byId('message-error').count(), 0, `no error: ${await byId('message-error').allInnerTexts()}`);
    assert.match(await byId('chat-context').innerText(), /^[1-9][\d,]* \/ 4,096 tokens$/);

    await byId('message-user').hover();
    await byId('message-edit').click();
    await byId('message-edit-input').fill('Name a fruit.');
    await byId('message-edit-save').click();
    // The regenerated reply may stream for a few milliseconds only (a short answer on a fast machine): a brief look
    // for it, then the idle reply and the send button.
    await page.locator('[data-testid="message-assistant"][data-streaming="true"]').waitFor({ timeout: 5_000 }).catch(() => {});
    await idle.last().waitFor({ timeout: GENERATION });
    await byId('chat-send').waitFor({ timeout: GENERATION });
    assert.equal((await byId('message-user').innerText()).trim().split('\n')[0], 'Name a fruit.');
    await byId('chat-regenerate').last().click();
    await byId('message-version').waitFor({ timeout: GENERATION });
    await byId('chat-send').waitFor({ timeout: GENERATION });
    assert.equal((await byId('message-version').innerText()).trim(), '2 / 2');
    await byId('message-version-prev').click();
    assert.equal((await byId('message-version').innerText()).trim(), '1 / 2');
  });

  test('code is highlighted and copied; the context menu and the keyboard shortcuts work', async () => {
    await byId('nav-chat').click();
    const code = 'fn main() {\n    println!("hi");\n}\n';
    const file = path.join(WORK, 'code-chat.json');
    fs.writeFileSync(
      file,
      JSON.stringify({
        title: 'Code in e2e',
        model: 'tandem-tiny',
        messages: [
          { role: 'user', content: 'Show me Rust.' },
          { role: 'assistant', content: 'Here:\n\n```rust\n' + code + '```\n' },
        ],
      }),
    );
    await byId('chat-import-input').setInputFiles(file);
    const block = page.locator('[data-testid="message-content"] pre code');
    await block.waitFor();
    // Coloured by the theme: a keyword's colour is not the code's own.
    const keyword = block.locator('span[class^="hljs-"]', { hasText: /^fn$/ });
    await keyword.waitFor();
    const [keywordColour, codeColour] = await Promise.all([keyword, block].map((l) => l.evaluate((el) => getComputedStyle(el).color)));
    assert.notEqual(keywordColour, codeColour, 'the keyword is coloured');
    assert.equal(await block.evaluate((el) => el.textContent), code);
    await shot('13-code.png');

    // Copy: the code as text, "Copied", which goes by itself.
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: URL });
    await byId('code-copy').click();
    await page.locator('[data-testid="code-copy"]', { hasText: 'Copied' }).waitFor();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), code);
    await page.locator('[data-testid="code-copy"]', { hasText: /^Copy$/ }).waitFor({ timeout: 5_000 });

    // The app's own context menu: Escape or a click outside closes it; a copy from it says Copied.
    await page.locator('[data-testid="message-assistant"] [data-testid="message-content"] p').click({ button: 'right' });
    const items = () => byId('context-menu-item').allInnerTexts();
    assert.deepEqual(await items(), ['Copy reply', 'Regenerate', 'Delete message']);
    await page.keyboard.press('Escape');
    await byId('context-menu').waitFor({ state: 'detached' });
    await block.click({ button: 'right' });
    assert.ok((await items()).includes('Copy code'));
    await byId('message-list').click({ position: { x: 5, y: 5 } });
    await byId('context-menu').waitFor({ state: 'detached' });
    await byId('message-user').click({ button: 'right' });
    await byId('context-menu-item').filter({ hasText: 'Copy message' }).click();
    await page.locator('[data-testid="copy-flash"]', { hasText: 'Copied' }).waitFor();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), 'Show me Rust.');
    await byId('copy-flash').waitFor({ state: 'detached', timeout: 5_000 });
    await byId('message-user').click({ button: 'right' });
    await byId('context-menu-item').filter({ hasText: 'Edit message' }).click();
    assert.equal(await byId('message-edit-input').inputValue(), 'Show me Rust.');
    await page.keyboard.press('Escape');
    await byId('message-edit-input').waitFor({ state: 'detached' });

    // Keys: ? lists them (Ctrl here, not macOS), Escape closes the list; Ctrl+Shift+M, / and Ctrl+Shift+O.
    await byId('message-list').click({ position: { x: 5, y: 5 } });
    await page.keyboard.press('?');
    await byId('shortcuts-help').waitFor();
    assert.match(await byId('shortcuts-help').innerText(), /Ctrl\+Shift\+O/);
    await page.keyboard.press('Escape');
    await byId('shortcuts-help').waitFor({ state: 'detached' });
    await page.keyboard.press('Control+Shift+M');
    await page.waitForFunction(() => document.activeElement?.getAttribute('data-testid') === 'chat-model-picker', null, { timeout: SHORT });
    await page.keyboard.press('Escape');
    await byId('message-list').click({ position: { x: 5, y: 5 } });
    await page.keyboard.press('/');
    await page.waitForFunction(() => document.activeElement?.getAttribute('data-testid') === 'chat-input', null, { timeout: SHORT });
    await page.keyboard.press('Control+Shift+O');
    await byId('message-user').waitFor({ state: 'detached' });
    assert.equal(await byId('chat-input').inputValue(), '');
  });

  test('at 720 px wide the conversation list, New chat and the Stats drawer are usable', async () => {
    await page.setViewportSize({ width: 720, height: 760 });
    try {
      await byId('nav-chat').click();
      await byId('new-chat').waitFor({ state: 'visible' });
      assert.ok(await byId('conversation-list').isVisible(), 'the conversation list is shown');
      for (const id of ['new-chat', 'chat-send', 'chat-settings-toggle', 'panel-toggle']) {
        const box = await byId(id).boundingBox();
        assert.ok(box && box.width > 0 && box.x >= 0 && box.x + box.width <= 720, `${id} is inside the window: ${JSON.stringify(box)}`);
      }
      const panel = byId('live-panel');
      const shown = (await panel.count()) > 0 && (await panel.isVisible());
      await byId('panel-toggle').click();
      await panel.waitFor({ state: shown ? 'hidden' : 'visible' });
      await shot(shown ? '09-narrow.png' : '09-narrow-stats.png');
      await byId('panel-toggle').click();
      await panel.waitFor({ state: shown ? 'visible' : 'hidden' });
      await shot(shown ? '09-narrow-stats.png' : '09-narrow.png');
      // The drawer, when open, closes with Escape.
      if (await panel.isVisible()) {
        await page.keyboard.press('Escape');
        await panel.waitFor({ state: 'hidden' });
      }
      // New chat works there.
      const before = await page.locator('[data-testid="conversation-item"].active').count();
      await byId('new-chat').click();
      assert.equal(await byId('message-user').count(), 0, 'a new, empty chat');
      assert.ok(before >= 0);
      // Models at this width: every row's controls inside the window.
      await openModels();
      const load = modelRow('tandem-tiny').locator('[data-testid="model-unload"], [data-testid="model-load"]');
      const box = await load.boundingBox();
      assert.ok(box && box.x + box.width <= 720, `Load/Unload is inside the window: ${JSON.stringify(box)}`);
      await shot('09-narrow-models.png');
    } finally {
      await page.setViewportSize({ width: 1400, height: 900 });
    }
  });

  test('a model unloads and loads from Models', async () => {
    await openModels();
    const row = modelRow('tandem-tiny');
    await row.waitFor();
    // The chat above loaded it.
    await page.locator('[data-testid="model-row"][data-model-id="tandem-tiny"][data-loaded="true"]').waitFor();
    await row.getByTestId('model-unload').click();
    await page.locator('[data-testid="model-row"][data-model-id="tandem-tiny"][data-loaded="false"]').waitFor({ timeout: GENERATION });
    assert.equal(await row.getByTestId('model-loaded').count(), 0);
    await shot('03-models-unloaded.png');
    await row.getByTestId('model-load').click();
    await page.locator('[data-testid="model-row"][data-model-id="tandem-tiny"][data-loaded="true"]').waitFor({ timeout: GENERATION });
    await row.getByTestId('model-loaded').waitFor();
    await shot('04-models-loaded.png');
  });

  test('the bundled model converts to 4-bit from Convert and appears under Models', async () => {
    await byId('nav-convert').click();
    await byId('convert-form').waitFor();
    await byId('convert-src').fill(TINY);
    await byId('convert-recipe').selectOption('uniform');
    await byId('convert-bits').selectOption('4');
    await byId('convert-name').fill('tandem-tiny-4bit');
    await byId('convert-start').click();
    await page.locator('[data-testid="convert-status"][data-state="running"], [data-testid="convert-status"][data-state="finished"]').first().waitFor();
    await shot('05-convert-running.png');
    await page
      .locator('[data-testid="convert-status"][data-state="finished"], [data-testid="convert-status"][data-state="error"]')
      .first()
      .waitFor({ timeout: CONVERSION });
    assert.equal(await byId('convert-error').count(), 0, `no conversion error: ${await byId('convert-error').allInnerTexts()}`);
    const written = (await byId('convert-result-path').innerText()).trim();
    const expected = path.join(WORK, 'models', 'tandem-tiny-4bit');
    assert.equal(fs.realpathSync(written), fs.realpathSync(expected), 'written into models_dir');
    assert.ok(fs.existsSync(path.join(expected, 'config.json')), 'config.json written');
    const progress = byId('convert-progress');
    assert.equal(await progress.getAttribute('data-done'), await progress.getAttribute('data-total'));
    await shot('06-convert-finished.png');

    await byId('convert-result').getByRole('button', { name: 'Show in Models' }).click();
    await byId('model-list').waitFor();
    const row = modelRow('tandem-tiny-4bit');
    await row.waitFor({ timeout: SHORT });
    assert.equal((await row.getByTestId('model-format').innerText()).trim().toLowerCase(), 'mlx');
    assert.match(await row.getByTestId('model-quantization').innerText(), /4/);
    assert.equal(await row.getByTestId('model-mtp').getAttribute('data-mtp-enabled'), 'true', 'the MTP head was kept');
    await row.getByTestId('model-load').click();
    await page.locator('[data-testid="model-row"][data-model-id="tandem-tiny-4bit"][data-loaded="true"]').waitFor({ timeout: GENERATION });
    await shot('07-models-converted.png');
    await row.getByTestId('model-unload').click();
    await page.locator('[data-testid="model-row"][data-model-id="tandem-tiny-4bit"][data-loaded="false"]').waitFor({ timeout: GENERATION });
  });

  test('converting onto an existing name offers a choice, not an API hint', async () => {
    await byId('nav-convert').click();
    await byId('convert-src').fill(TINY);
    await byId('convert-recipe').selectOption('mixed_4_6');
    assert.match(await byId('convert-bits').innerText(), /4–6-bit \(mixed\)/);
    await byId('convert-recipe').selectOption('uniform');
    await byId('convert-bits').selectOption('4');
    await byId('convert-name').fill('tandem-tiny-4bit');
    await byId('convert-start').click();
    await byId('convert-replace').waitFor();
    const message = (await byId('convert-error').innerText()).trim();
    assert.match(message, /tandem-tiny-4bit already exists\.$/);
    assert.ok(!/force/.test(await byId('convert-form').innerText()), 'no "force" shown to a person');
    await shot('07b-convert-exists.png');
    await byId('convert-rename').click();
    assert.equal(await byId('convert-replace').count(), 0);
    assert.ok(await byId('convert-name').evaluate((el) => el === document.activeElement), 'the name field has the focus');
  });

  test('a folder that is not a model gets a clear error', async () => {
    const notModel = path.join(WORK, 'models', 'not-a-model');
    await byId('nav-convert').click();
    await byId('convert-src').fill(notModel);
    await byId('convert-name').fill('');
    await byId('convert-start').click();
    await page.locator('[data-testid="convert-status"][data-state="error"]').waitFor();
    const message = (await byId('convert-error').innerText()).trim();
    assert.ok(message.includes('not-a-model'), `the error names the folder: ${message}`);
    assert.match(message, /not a model/i);
    await byId('error-banner').waitFor();
    assert.match(await byId('error-message').innerText(), /not a model/i);
    await shot('08-convert-not-a-model.png');
    assert.equal(fs.existsSync(path.join(WORK, 'models', 'not-a-model-4bit')), false, 'nothing written');
    await byId('error-dismiss').click();
  });

  test("the desktop shell's drop hook opens Convert with the dropped folder", async () => {
    await byId('nav-chat').click();
    await page.evaluate((p) => window.onFolderDropped(p), TINY);
    await page.waitForFunction(
      (p) => document.querySelector('[data-testid="convert-src"]')?.value === p && location.hash.includes('convert'),
      TINY,
      { timeout: SHORT },
    );
    await page.evaluate(() => window.dispatchEvent(new CustomEvent('tandem://dropped-folder', { detail: { path: '/tmp/dropped-by-event' } })));
    await page.waitForFunction(() => document.querySelector('[data-testid="convert-src"]')?.value === '/tmp/dropped-by-event', null, {
      timeout: SHORT,
    });
  });

  test('a folder outside the models folder converts where it lies once allowed, and one is added as it is', async () => {
    const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-e2e-outside-'));
    try {
      const src = path.join(outside, 'my-checkpoint');
      fs.cpSync(TINY, src, { recursive: true });
      const before = fs.readdirSync(src).sort();
      await byId('nav-convert').click();
      await byId('convert-src').fill(src);
      await byId('convert-recipe').selectOption('uniform');
      await byId('convert-bits').selectOption('4');
      await byId('convert-name').fill('outside-4bit');
      await byId('convert-start').click();
      // Not an error to dismiss: a question, naming the folder.
      await byId('convert-allow-folder').waitFor();
      assert.ok((await byId('convert-question').innerText()).includes(src), 'the question names the folder');
      assert.equal(await byId('convert-error').count(), 0, 'a question, not an error');
      assert.equal(await byId('error-banner').count(), 0, 'no error banner for a question');
      await shot('09-convert-allow-folder.png');
      await byId('convert-allow-folder').click();
      await page
        .locator('[data-testid="convert-status"][data-state="finished"], [data-testid="convert-status"][data-state="error"]')
        .first()
        .waitFor({ timeout: CONVERSION });
      assert.equal(await byId('convert-error').count(), 0, `no conversion error: ${await byId('convert-error').allInnerTexts()}`);
      const out = path.join(WORK, 'models', 'outside-4bit');
      assert.equal(fs.realpathSync((await byId('convert-result-path').innerText()).trim()), fs.realpathSync(out));
      assert.deepEqual(fs.readdirSync(src).sort(), before, 'nothing written beside the source');

      const added = path.join(outside, 'already-mlx');
      fs.cpSync(out, added, { recursive: true });
      await openModels();
      await byId('models-add-folder').click();
      await byId('add-folder-path').fill(added);
      await byId('add-folder-submit').click();
      await byId('add-folder-allow').click();
      const row = modelRow('already-mlx');
      await row.waitFor({ timeout: SHORT });
      assert.match(await row.getByTestId('model-quantization').innerText(), /4/);
      await shot('10-models-added-folder.png');
      const toml = fs.readFileSync(path.join(WORK, 'models.toml'), 'utf8');
      assert.ok(toml.includes('name = "already-mlx"') && toml.includes(fs.realpathSync(added)), 'registered in models.toml');
    } finally {
      fs.rmSync(outside, { recursive: true, force: true });
    }
  });

  test('a model downloads from the Hub, converts keeping its MTP head, and answers a chat', async () => {
    await byId('nav-download').click();
    await byId('download-repo').fill('tandem/tiny');
    await byId('download-start').click();
    const row = page.locator('[data-testid="download-row"][data-repo="tandem/tiny"]');
    await page.locator('[data-testid="download-row"][data-repo="tandem/tiny"][data-state="finished"]').waitFor({ timeout: GENERATION });
    assert.match(await row.getByTestId('download-done').innerText(), /tiny/);
    const progress = row.getByTestId('download-progress');
    assert.equal(await progress.getAttribute('data-done'), await progress.getAttribute('data-total'));
    await shot('11-download-finished.png');
    // The snapshot in the Hub cache layout, linked into the models folder.
    assert.ok(fs.lstatSync(path.join(WORK, 'models', 'tiny')).isSymbolicLink(), 'linked into models_dir');
    assert.ok(fs.existsSync(path.join(WORK, 'hf', 'hub', 'models--tandem--tiny', 'refs', 'main')));
    // A reload finds the download again (it is the engine's job, not the page's).
    await page.reload({ waitUntil: 'load' });
    await byId('nav-download').click();
    await page.locator('[data-testid="download-row"][data-repo="tandem/tiny"][data-state="finished"]').waitFor();

    await page.locator('[data-testid="download-row"][data-repo="tandem/tiny"]').getByTestId('download-convert').click();
    await page.waitForFunction(() => location.hash.includes('convert') && document.querySelector('[data-testid="convert-src"]')?.value.endsWith('/tiny'));
    await byId('convert-recipe').selectOption('uniform');
    await byId('convert-bits').selectOption('4');
    await byId('convert-name').fill('tiny-pulled-4bit');
    await byId('convert-start').click();
    await page
      .locator('[data-testid="convert-status"][data-state="finished"], [data-testid="convert-status"][data-state="error"]')
      .first()
      .waitFor({ timeout: CONVERSION });
    assert.equal(await byId('convert-error').count(), 0, `no conversion error: ${await byId('convert-error').allInnerTexts()}`);
    await openModels();
    const model = modelRow('tiny-pulled-4bit');
    await model.waitFor();
    assert.equal(await model.getByTestId('model-mtp').getAttribute('data-mtp-enabled'), 'true', 'MTP head kept and verified');

    await byId('nav-chat').click();
    await byId('new-chat').click();
    await byId('chat-model-picker').selectOption('tiny-pulled-4bit');
    await byId('chat-input').fill('Say something.');
    await byId('chat-send').click();
    await byId('message-assistant').last().waitFor();
    await byId('chat-send').waitFor({ timeout: GENERATION });
    await page.waitForFunction(() => (document.querySelector('[data-testid="panel-acceptance"]')?.textContent ?? '').includes('%'), null, {
      timeout: GENERATION,
    });
    const text = (await byId('message-assistant').last().getByTestId('message-content').innerText()).trim();
    assert.ok(text.length > 0, 'the downloaded model answered');
    await shot('12-chat-with-downloaded-model.png');
  });
  test('a head-less conversion found by search gets its MTP head grafted from its base', async () => {
    await byId('nav-download').click();
    await byId('catalog-search').fill('tiny');
    // The catalogue entry of models.toml, and the Hub's other match.
    await page.locator('[data-testid="catalog-row"][data-repo="tandem/tiny"]').waitFor();
    const hit = page.locator('[data-testid="hub-result"][data-repo="tandem/tiny-mlx"]');
    await hit.waitFor({ timeout: 10_000 });
    await hit.click();
    const preview = byId('download-preview');
    await preview.waitFor({ timeout: 10_000 });
    assert.equal(await preview.getAttribute('data-fits'), 'true');
    assert.equal(await preview.getAttribute('data-mtp'), 'false');
    assert.match(await byId('download-advice').innerText(), /no MTP head.*tandem\/tiny/);
    assert.equal(await byId('download-repo').inputValue(), 'tandem/tiny-mlx');
    await byId('download-start').click();
    const row = page.locator('[data-testid="download-row"][data-repo="tandem/tiny-mlx"][data-state="finished"]');
    await row.waitFor({ timeout: GENERATION });
    await row.getByTestId('download-graft').click();
    const graft = page.locator('[data-testid="download-row"][data-graft-onto="tiny-mlx"]');
    await page
      .locator('[data-testid="download-row"][data-graft-onto="tiny-mlx"][data-state="finished"], [data-testid="download-row"][data-graft-onto="tiny-mlx"][data-state="error"]')
      .waitFor({ timeout: CONVERSION });
    assert.equal(await graft.getByTestId('download-error').count(), 0, `no graft error: ${await graft.innerText()}`);
    assert.match(await graft.innerText(), /MTP head for tiny-mlx/);
    assert.match(await graft.getByTestId('download-done').innerText(), /tiny-mlx-mtp/);
    await shot('14-head-grafted.png');
    await openModels();
    const model = modelRow('tiny-mlx-mtp');
    await model.waitFor();
    assert.match(await model.getByTestId('model-mtp').innerText(), /on · depth/, 'the grafted head is available and on');
    // The conversion itself is untouched and still head-less, offering the same graft.
    assert.equal(await modelRow('tiny-mlx').getByTestId('model-graft').count(), 1);
  });

  test('Settings switches the window to the dark theme at once and shows the server', async () => {
    await byId('nav-settings').click();
    const theme = byId('settings-theme');
    await theme.waitFor();
    assert.equal(await theme.inputValue(), 'system');
    const saved = () => page.waitForResponse((r) => r.url().endsWith('/api/settings') && r.request().method() === 'PATCH');
    try {
      const patch = saved();
      await theme.selectOption('dark');
      await page.waitForFunction(() => document.documentElement.dataset.theme === 'dark', null, { timeout: SHORT });
      assert.equal((await patch).status(), 200);
      assert.equal(await theme.inputValue(), 'dark');
      assert.equal(await byId('settings-theme-error').count(), 0);
      // The whole window is painted with the dark palette.
      assert.equal(await page.evaluate(() => getComputedStyle(document.body).backgroundColor), 'rgb(22, 22, 24)');
      assert.match(await byId('settings-server-url').innerText(), /^http:\/\/127\.0\.0\.1:\d+$/);
      // The log (read every 2 s while shown) has the PATCH that saved the theme.
      await page.locator('[data-testid="settings-request-row"]').filter({ hasText: 'PATCH' }).filter({ hasText: '/api/settings' }).first().waitFor();
      await shot('settings.png');
    } finally {
      // The tests after this one, and their screenshots, keep the default theme.
      const patch = saved();
      await theme.selectOption('system');
      await patch;
    }
    assert.equal(await theme.inputValue(), 'system');
  });
});
