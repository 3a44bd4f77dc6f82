import { defineConfig } from 'vitest/config';

// The engine `tandem serve` serves ui/dist itself; in development Vite's server forwards the API to it.
const env = (globalThis as { process?: { env: Record<string, string | undefined> } }).process?.env ?? {};
const engine = env.TANDEM_ENGINE ?? 'http://127.0.0.1:11435';

export default defineConfig({
  // Relative asset paths: dist works served at / by the engine and from tauri:// in the desktop window.
  base: './',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    // Everything bundled; nothing is fetched from elsewhere at run time.
    assetsInlineLimit: 8192,
  },
  server: {
    port: 5173,
    strictPort: false,
    proxy: {
      '/v1': { target: engine, changeOrigin: true },
      '/api': { target: engine, changeOrigin: true },
    },
  },
  test: {
    environment: 'jsdom',
    include: ['test/**/*.test.{ts,tsx}'],
    setupFiles: ['test/setup.ts'],
    css: false,
    watch: false,
  },
});
