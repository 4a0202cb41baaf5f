/** The mime renderer extension for the `%%gpumem` report's JSON output. */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { RENDERER_RANK, rendererFactory } from './report';

const extension: IRenderMime.IExtension = {
  id: 'jupyter-gpumem:report-renderer',
  description: 'Renders %%gpumem reports with the theme of the page.',
  rendererFactory,
  rank: RENDERER_RANK,
  dataType: 'json'
};

export default extension;
