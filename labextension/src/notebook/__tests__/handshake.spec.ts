import * as fs from 'fs';
import * as path from 'path';

import { REPORT_MIME_TYPE } from '../../wire';
import { ANSWER, answerKernel, answerSession, COMM_TARGET, ICommTargets } from '../handshake';

type Target = (comm: any, msg: any) => void;

class FakeKernel implements ICommTargets {
  targets = new Map<string, Target>();
  registrations = 0;
  registerCommTarget(name: string, callback: Target): void {
    this.registrations += 1;
    this.targets.set(name, callback);
  }
}

class FakeSignal {
  slots: Array<() => void> = [];
  connect(slot: () => void): void {
    this.slots.push(slot);
  }
  emit(): void {
    this.slots.forEach(s => s());
  }
}

describe('handshake', () => {
  it('answers the kernel that our renderer is here', () => {
    const kernel = new FakeKernel();
    answerKernel(kernel);
    const sent: unknown[] = [];
    kernel.targets.get(COMM_TARGET)!({ send: (data: unknown) => sent.push(data) }, {});
    const { version } = JSON.parse(
      fs.readFileSync(path.resolve(__dirname, '..', '..', '..', 'package.json'), 'utf-8')
    );
    expect(sent).toEqual([{ renderer: REPORT_MIME_TYPE, version }]);
    expect(version).toMatch(/^\d+\.\d+\.\d+/);
    expect(ANSWER.renderer).toBe('application/vnd.jupyter-gpumem.report+json');
  });

  it('registers once per kernel connection, and on each new kernel of a session', () => {
    const first = new FakeKernel();
    const second = new FakeKernel();
    const kernelChanged = new FakeSignal();
    const session = {
      session: { kernel: first as unknown },
      kernelChanged,
      sessionChanged: new FakeSignal()
    };
    answerSession(session as any);
    answerKernel(first);
    expect(first.registrations).toBe(1);
    session.session.kernel = second;
    kernelChanged.emit();
    kernelChanged.emit();
    expect(second.registrations).toBe(1);
    expect(second.targets.has(COMM_TARGET)).toBe(true);
  });

  it('leaves a session without a kernel alone', () => {
    expect(() => answerKernel(null)).not.toThrow();
    const session = { session: null, kernelChanged: new FakeSignal(), sessionChanged: new FakeSignal() };
    expect(() => answerSession(session as any)).not.toThrow();
  });
});
