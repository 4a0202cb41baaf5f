/**
 * Where the UI tests write their screenshots, and what a screenshot of the whole page shows.
 *
 * An ordinary run writes under ui-tests/test-results/ (git-ignored), so running the
 * tests leaves the tree clean. The committed screenshots in ui-tests/screenshots/ are
 * replaced only on purpose: `GPUMEM_UPDATE_SCREENSHOTS=1 npm test`, or `npm run screenshots`.
 */
import { expect, IJupyterLabPageFixture } from '@jupyterlab/galata';
import * as path from 'path';

const UPDATE_ENV = 'GPUMEM_UPDATE_SCREENSHOTS';
const COMMITTED = path.resolve(__dirname, '..', 'screenshots');
const SCRATCH = path.resolve(__dirname, '..', 'test-results', 'screenshots');

/** The path of the screenshot `name` (a file name such as `sidebar-light.png`). */
export function screenshotPath(name: string): string {
  const update = process.env[UPDATE_ENV] === '1';
  return path.join(update ? COMMITTED : SCRATCH, name);
}

/**
 * One launcher, of the server's root folder: Galata opens the page on a launcher of the
 * test's own folder, whose generated name (the test's title) is no place a user would be.
 */
export async function rootLauncher(page: IJupyterLabPageFixture): Promise<void> {
  await page.filebrowser.openHomeDirectory();
  await page.evaluate(async () => {
    const commands = (window as any).jupyterapp.commands;
    await commands.execute('application:close-all');
    await commands.execute('launcher:create');
  });
  await expect(page.locator('.jp-Launcher')).toHaveCount(1);
  await expect(page.locator('.jp-Launcher-cwd')).toHaveText(/^\/?$/);
}
