import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../../style/icons/gpu.svg';

/** The sidebar tab and status bar icon. */
export const gpuIcon = new LabIcon({ name: 'jupyter-gpumem:gpu', svgstr: gpuSvg });
