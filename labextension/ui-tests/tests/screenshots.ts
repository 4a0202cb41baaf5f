/**
 * Where the UI tests write their screenshots.
 *
 * An ordinary run writes under ui-tests/test-results/ (git-ignored), so running the
 * tests leaves the tree clean. The committed screenshots in ui-tests/screenshots/ are
 * replaced only on purpose: `GPUMEM_UPDATE_SCREENSHOTS=1 npm test`, or `npm run screenshots`.
 */
import * as path from 'path';

const UPDATE_ENV = 'GPUMEM_UPDATE_SCREENSHOTS';
const COMMITTED = path.resolve(__dirname, '..', 'screenshots');
const SCRATCH = path.resolve(__dirname, '..', 'test-results', 'screenshots');

/** The path of the screenshot `name` (a file name such as `sidebar-light.png`). */
export function screenshotPath(name: string): string {
  const update = process.env[UPDATE_ENV] === '1';
  return path.join(update ? COMMITTED : SCRATCH, name);
}
