/**
 * Galata configuration for the jupyter-gpumem UI tests.
 *
 * Runs against a system Chromium (Debian: `apt-get install chromium`), no
 * Playwright browser download; set CHROMIUM_PATH to use another binary.
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.JUPYTER_GPUMEM_UI_PORT || '8891';
const baseURL = `http://localhost:${port}`;

module.exports = {
  ...baseConfig,
  timeout: 90000,
  retries: 0,
  workers: 1,
  reporter: [['list'], ['html', { open: 'never' }]],
  // Git-ignored; tests/screenshots.ts writes screenshots here unless asked to update the
  // committed ones (GPUMEM_UPDATE_SCREENSHOTS=1, `npm run screenshots`).
  outputDir: 'test-results',
  use: {
    ...baseConfig.use,
    baseURL,
    video: 'off',
    viewport: { width: 1440, height: 900 },
    trace: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/lib/chromium/chromium'
    }
  },
  webServer: {
    command: 'jupyter lab --config jupyter_server_test_config.py',
    url: `${baseURL}/lab`,
    timeout: 120000,
    reuseExistingServer: !process.env.CI
  }
};
