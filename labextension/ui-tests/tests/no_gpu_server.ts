/**
 * A second JupyterLab server for the tests of a machine without a GPU: the same configuration
 * as the first (jupyter_server_test_config.py), its NVML stand-in failing to start ("library
 * not found"), on a port of its own. `useNoGpuServer()` inside a `test.describe` starts it before
 * the group's tests, points their pages at it, and stops it after them.
 */
import { expect, test } from '@jupyterlab/galata';
import { ChildProcess, spawn } from 'child_process';
import * as path from 'path';

const UI_TESTS = path.resolve(__dirname, '..');
// Picked free by playwright.config.js, as the first server's port is.
const NO_GPU_PORT = process.env.JUPYTER_GPUMEM_UI_NO_GPU_PORT;
export const NO_GPU_URL = `http://localhost:${NO_GPU_PORT}`;

/** Whether anything answers HTTP at `url`. */
async function answers(url: string): Promise<boolean> {
  try {
    await fetch(url);
    return true;
  } catch {
    return false;
  }
}

async function waitForServer(server: ChildProcess, log: () => string): Promise<void> {
  const deadline = Date.now() + 120000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) {
      throw new Error(`the no-GPU server exited (${server.exitCode}):\n${log()}`);
    }
    try {
      const response = await fetch(`${NO_GPU_URL}/jupyter-gpumem/api/health`);
      if (response.ok) {
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise(resolve => setTimeout(resolve, 250));
  }
  throw new Error(`the no-GPU server did not answer on ${NO_GPU_URL}:\n${log()}`);
}

/** Run the enclosing describe group's tests against the no-GPU server. */
export function useNoGpuServer(): void {
  let server: ChildProcess | null = null;
  test.use({ baseURL: NO_GPU_URL });

  test.beforeAll(async ({}, testInfo) => {
    testInfo.setTimeout(150000);
    if (!NO_GPU_PORT) {
      throw new Error('JUPYTER_GPUMEM_UI_NO_GPU_PORT is unset: playwright.config.js sets it');
    }
    if (await answers(NO_GPU_URL)) {
      throw new Error(`${NO_GPU_URL} already answers: a server this run did not start`);
    }
    let output = '';
    server = spawn('jupyter', ['lab', '--config', 'jupyter_server_test_config.py'], {
      cwd: UI_TESTS,
      env: {
        ...process.env,
        JUPYTER_GPUMEM_UI_PORT: NO_GPU_PORT,
        JUPYTER_GPUMEM_UI_NVML_ERROR: 'library_not_found'
      },
      stdio: ['ignore', 'pipe', 'pipe']
    });
    const keep = (chunk: Buffer) => {
      output = (output + chunk.toString()).slice(-4000);
    };
    server.stdout?.on('data', keep);
    server.stderr?.on('data', keep);
    await waitForServer(server, () => output);
    // This must be our server, not one left over on the port: it says NVML is unavailable.
    const health = await (await fetch(`${NO_GPU_URL}/jupyter-gpumem/api/health`)).json();
    expect(health.nvml).toEqual({ available: false, reason: 'library not found' });
  });

  test.afterAll(async () => {
    const running = server;
    server = null;
    if (running && running.exitCode === null) {
      const exited = new Promise(resolve => running.once('exit', resolve));
      running.kill('SIGTERM'); // the server shuts its kernels down on the way out
      await Promise.race([exited, new Promise(resolve => setTimeout(resolve, 15000))]);
    }
  });
}
