/**
 * Galata configuration for the jupyter-gpumem UI tests.
 *
 * Runs against a system Chromium (Debian: `apt-get install chromium`), no
 * Playwright browser download; set CHROMIUM_PATH to use another binary.
 *
 * The tests start their own JupyterLab on a free port and never reuse a server they did not
 * start: a user's own JupyterLab (on 8888, or on 8891 where these tests once ran) is never
 * reached. To prove it, a stand-in for such a server holds 8891 while the tests run
 * (user_server.js; left out where something already listens there) and own_server.spec.ts
 * checks that the pages reach this run's server. The ports are picked once, in the runner's
 * process, and handed to the workers and the servers through the environment
 * (JUPYTER_GPUMEM_UI_PORT, and JUPYTER_GPUMEM_UI_NO_GPU_PORT for no_gpu_server.ts); set them
 * to choose the ports yourself.
 */
const { execFileSync } = require('child_process');

const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const USER_SERVER_PORT = 8891;

/** Ports free now on this machine, distinct from each other (all held open while picked). */
function freePorts(count) {
  const script = `
    const net = require('net');
    const servers = Array.from({ length: ${count} }, () => net.createServer());
    Promise.all(servers.map(s => new Promise(ok => s.listen(0, '127.0.0.1', ok)))).then(() => {
      process.stdout.write(servers.map(s => s.address().port).join(' '));
      servers.forEach(s => s.close());
    });`;
  return execFileSync(process.execPath, ['-e', script], { encoding: 'utf-8' })
    .trim()
    .split(' ');
}

if (!process.env.JUPYTER_GPUMEM_UI_PORT || !process.env.JUPYTER_GPUMEM_UI_NO_GPU_PORT) {
  const [port, noGpuPort] = freePorts(2);
  process.env.JUPYTER_GPUMEM_UI_PORT ||= port;
  process.env.JUPYTER_GPUMEM_UI_NO_GPU_PORT ||= noGpuPort;
}
const port = Number(process.env.JUPYTER_GPUMEM_UI_PORT);
const baseURL = `http://localhost:${port}`;

const ownServer = {
  command: 'jupyter lab --config jupyter_server_test_config.py',
  url: `${baseURL}/lab`,
  timeout: 120000,
  // A server already answering there is not ours: fail rather than test it.
  reuseExistingServer: false
};
const userServer = {
  command: `node user_server.js ${USER_SERVER_PORT}`,
  port: USER_SERVER_PORT,
  timeout: 10000,
  // Whatever already listens on 8891 stands in for the user's server as well as ours would.
  reuseExistingServer: true
};

module.exports = {
  ...baseConfig,
  timeout: 90000,
  retries: 0,
  workers: 1,
  reporter: [['list'], ['html', { open: 'never' }]],
  // Git-ignored; tests/screenshots.ts writes screenshots here unless asked to update the
  // committed ones (GPUMEM_UPDATE_SCREENSHOTS=1, `npm run screenshots`).
  outputDir: 'test-results',
  // The committed notebooks are only ever uploaded as copies: fail if a run changed one.
  globalSetup: require.resolve('./notebooks_unchanged.js'),
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
  webServer: port === USER_SERVER_PORT ? [ownServer] : [userServer, ownServer]
};
