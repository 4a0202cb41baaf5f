/**
 * Tell each notebook's kernel that this front end draws jupyter_gpumem reports.
 *
 * Loading the extension in a kernel opens a comm to the target `COMM_TARGET` (a name
 * on the wire, `jupyter_gpumem.frontend`); the answer here tells the kernel not to add
 * a widget view of each report (our renderer draws the timeline). A front end without
 * this extension closes the comm instead, and the kernel adds the widget view there.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { REPORT_MIME_TYPE } from '../wire';

export const COMM_TARGET = 'jupyter_gpumem.frontend';

// webpack (and jest) resolve this require and bundle package.json's fields; an import
// cannot reach it, being outside the compiled src/ folder.
declare const require: (id: '../../package.json') => { version: string };
const PACKAGE = require('../../package.json');

/** What the renderer answers: the mime type it draws and this package's version. */
export const ANSWER = { renderer: REPORT_MIME_TYPE, version: PACKAGE.version };

/** The part of a kernel connection this module uses. */
export type ICommTargets = Pick<Kernel.IKernelConnection, 'registerCommTarget'>;

const answered = new WeakSet<ICommTargets>();

function answer(comm: Kernel.IComm, _msg: KernelMessage.ICommOpenMsg): void {
  comm.send(ANSWER);
}

/** Answer the kernel's question on this connection; once per connection. */
export function answerKernel(kernel: ICommTargets | null | undefined): void {
  if (!kernel || answered.has(kernel)) {
    return;
  }
  kernel.registerCommTarget(COMM_TARGET, answer);
  answered.add(kernel);
}

/** Answer on the session's kernel now and on every kernel it changes to. */
export function answerSession(session: ISessionContext): void {
  const follow = () => answerKernel(session.session?.kernel);
  session.kernelChanged.connect(follow);
  session.sessionChanged.connect(follow);
  follow();
}
