// A mock of the Hugging Face Hub for the browser e2e test: serves the bundled tandem-tiny as repo
// `tandem/tiny` with the endpoints Tandem's client uses (the `?blobs=true` listing, `resolve` redirected
// to a CDN path). Prints its URL on stdout. Usage: node mock_hub.mjs MODEL_DIR
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const dir = process.argv[2];
const COMMIT = 'fedcba9876543210fedcba9876543210fedcba98';
const files = fs
  .readdirSync(dir)
  .sort()
  .map((name) => {
    const bytes = fs.readFileSync(path.join(dir, name));
    const sha256 = crypto.createHash('sha256').update(bytes).digest('hex');
    return { name, bytes, sha256, lfs: name.endsWith('.safetensors') || name === 'tokenizer.json' };
  });

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  if (url.pathname === '/api/models/tandem/tiny/revision/main') {
    const siblings = files.map((f) => ({
      rfilename: f.name,
      size: f.bytes.length,
      blobId: f.sha256.slice(0, 40),
      ...(f.lfs ? { lfs: { sha256: f.sha256, size: f.bytes.length, pointerSize: 134 } } : {}),
    }));
    res.writeHead(200, { 'Content-Type': 'application/json' });
    return res.end(JSON.stringify({ id: 'tandem/tiny', sha: COMMIT, siblings }));
  }
  const resolve = url.pathname.match(/^\/tandem\/tiny\/resolve\/([0-9a-f]{40})\/(.+)$/);
  const file = resolve && resolve[1] === COMMIT && files.find((f) => f.name === decodeURIComponent(resolve[2]));
  if (file) {
    res.writeHead(302, { Location: `/cdn/${file.sha256}`, 'X-Repo-Commit': COMMIT, ETag: `"${file.sha256}"` });
    return res.end();
  }
  const cdn = url.pathname.match(/^\/cdn\/([0-9a-f]{64})$/);
  const blob = cdn && files.find((f) => f.sha256 === cdn[1]);
  if (blob) {
    res.writeHead(200, { 'Content-Length': blob.bytes.length, 'Accept-Ranges': 'bytes' });
    return res.end(blob.bytes);
  }
  res.writeHead(404, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify({ error: 'Repository not found' }));
});
server.listen(0, '127.0.0.1', () => console.log(`http://127.0.0.1:${server.address().port}`));
