/**
 * Playwright global setup: the committed notebooks (notebooks/ and ui-tests/notebooks/) are
 * read before the UI tests and again after them, and the run fails if any was changed, added
 * or removed. The tests upload copies to the server's temporary root; JupyterLab saving what a
 * run produced into a committed notebook would leave `git status` dirty.
 */
const fs = require('fs');
const path = require('path');

const REPO = path.resolve(__dirname, '..', '..');
const FOLDERS = ['notebooks', path.join('labextension', 'ui-tests', 'notebooks')];

/** Each notebook's path (from the repository root) and its bytes. */
function notebooks() {
  const found = new Map();
  for (const folder of FOLDERS) {
    const dir = path.join(REPO, folder);
    for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
      if (name.endsWith('.ipynb')) {
        found.set(path.join(folder, name), fs.readFileSync(path.join(dir, name)));
      }
    }
  }
  return found;
}

module.exports = async function notebooksUnchanged() {
  const before = notebooks();
  return async () => {
    const after = notebooks();
    const same = name =>
      before.has(name) && after.has(name) && before.get(name).equals(after.get(name));
    const changed = [...new Set([...before.keys(), ...after.keys()])].filter(n => !same(n)).sort();
    if (changed.length) {
      throw new Error(`the UI tests changed committed notebooks: ${changed.join(', ')}`);
    }
  };
};
