/**
 * The wire: what the server and the kernel send, as types with parse functions that
 * check the shape once at the boundary, and the single place that fetches.
 *
 * - live.ts: the server's sample JSON and its other answers, the live view's input;
 * - report.ts: the `%%gpumem` report's JSON and its mime type, the report views' input;
 * - request.ts: `GET {base_url}/jupyter-gpumem/api/...`, parsed with live.ts;
 * - json.ts: the readers both formats parse with, and WireFormatError.
 */
export { WireFormatError } from './json';
export * from './live';
export * from './report';
export * from './request';
