// A mock of the Hugging Face Hub for the browser e2e test: serves the bundled tandem-tiny as repo
// `tandem/tiny` and, when a second folder is given, a head-less MLX conversion of it as `tandem/tiny-mlx`
// (its card naming tandem/tiny as its base), with the endpoints Tandem's client uses (the `?blobs=true`
// listing, `resolve` redirected to a CDN path, HTTP Range, `/api/models?search=`). Prints its URL on stdout.
// Usage: node mock_hub.mjs MODEL_DIR [HEADLESS_MLX_DIR]
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

function repo(id, dir, commit, base) {
  const files = fs
    .readdirSync(dir)
    .filter((name) => fs.statSync(path.join(dir, name)).isFile())
    .sort()
    .map((name) => {
      const bytes = fs.readFileSync(path.join(dir, name));
      const sha256 = crypto.createHash('sha256').update(bytes).digest('hex');
      return { name, bytes, sha256, lfs: name.endsWith('.safetensors') || name === 'tokenizer.json' };
    });
  return { id, commit, files, base };
}

const repos = [repo('tandem/tiny', process.argv[2], 'fedcba9876543210fedcba9876543210fedcba98', null)];
if (process.argv[3]) repos.push(repo('tandem/tiny-mlx', process.argv[3], '0badc0de0badc0de0badc0de0badc0de0badc0de', 'tandem/tiny'));

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  if (url.pathname === '/api/models') {
    const q = (url.searchParams.get('search') ?? '').toLowerCase();
    const found = repos.filter((r) => r.id.includes(q)).map((r) => ({ id: r.id, downloads: r.files.length, likes: 0, tags: [] }));
    res.writeHead(200, { 'Content-Type': 'application/json' });
    return res.end(JSON.stringify(found));
  }
  const info = url.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/);
  const listed = info && repos.find((r) => r.id === info[1] && (info[2] === 'main' || info[2] === r.commit));
  if (listed) {
    const siblings = listed.files.map((f) => ({
      rfilename: f.name,
      size: f.bytes.length,
      blobId: f.sha256.slice(0, 40),
      ...(f.lfs ? { lfs: { sha256: f.sha256, size: f.bytes.length, pointerSize: 134 } } : {}),
    }));
    res.writeHead(200, { 'Content-Type': 'application/json' });
    const card = listed.base ? { cardData: { base_model: listed.base } } : {};
    return res.end(JSON.stringify({ id: listed.id, sha: listed.commit, siblings, ...card }));
  }
  const resolve = url.pathname.match(/^\/([^/]+\/[^/]+)\/resolve\/([0-9a-f]{40})\/(.+)$/);
  const owner = resolve && repos.find((r) => r.id === resolve[1] && r.commit === resolve[2]);
  const file = owner && owner.files.find((f) => f.name === decodeURIComponent(resolve[3]));
  if (file) {
    res.writeHead(302, { Location: `/cdn/${file.sha256}`, 'X-Repo-Commit': owner.commit, ETag: `"${file.sha256}"` });
    return res.end();
  }
  const cdn = url.pathname.match(/^\/cdn\/([0-9a-f]{64})$/);
  const blob = cdn && repos.flatMap((r) => r.files).find((f) => f.sha256 === cdn[1]);
  if (blob) {
    // `bytes=FROM-` or `bytes=FROM-TO` (inclusive).
    const range = (req.headers.range ?? '').match(/^bytes=(\d+)-(\d*)$/);
    if (range) {
      const from = Math.min(Number(range[1]), blob.bytes.length);
      const end = range[2] ? Math.min(Number(range[2]) + 1, blob.bytes.length) : blob.bytes.length;
      const body = blob.bytes.subarray(from, end);
      res.writeHead(206, {
        'Content-Length': body.length,
        'Accept-Ranges': 'bytes',
        'Content-Range': `bytes ${from}-${end - 1}/${blob.bytes.length}`,
      });
      return res.end(body);
    }
    res.writeHead(200, { 'Content-Length': blob.bytes.length, 'Accept-Ranges': 'bytes' });
    return res.end(blob.bytes);
  }
  res.writeHead(404, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify({ error: 'Repository not found' }));
});
server.listen(0, '127.0.0.1', () => console.log(`http://127.0.0.1:${server.address().port}`));
