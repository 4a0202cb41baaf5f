/**
 * The UI tests reach only the JupyterLab they started: playwright.config.js picks a free port
 * for it and never reuses a server, while user_server.js (or whatever already listens there)
 * holds 8891 with a token page, as a user's own JupyterLab would.
 */
import { expect, test } from '@jupyterlab/galata';

const USER_SERVER = 'http://localhost:8891';

test('the pages reach this run\'s server, not the one on 8891', async ({ page, baseURL }) => {
  const ours = new URL(baseURL ?? '');
  expect(ours.port).not.toBe('8891');
  expect(ours.port).toBe(process.env.JUPYTER_GPUMEM_UI_PORT);

  // Something answers on 8891 all along, and it is not this run's server.
  const user = await fetch(`${USER_SERVER}/jupyter-gpumem/api/sample`);
  expect(await user.text()).not.toContain('python train.py --config gpt2.yaml');

  // This run's server samples the NVML stand-in of jupyter_server_test_config.py.
  const sample = await (await fetch(`${baseURL}/jupyter-gpumem/api/sample`)).text();
  expect(sample).toContain('NVIDIA H100 80GB HBM3');
  expect(sample).toContain('python train.py --config gpt2.yaml');

  // And the page Galata opened is JupyterLab with our sidebar, no token page.
  expect(new URL(page.url()).port).toBe(ours.port);
  await expect(page.locator('#jp-main-dock-panel')).toBeVisible();
  await expect(page.getByText('Token authentication is enabled')).toHaveCount(0);
  await expect(page.locator('[id="jupyter-gpumem:status"]')).toBeVisible();
});
