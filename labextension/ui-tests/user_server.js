/**
 * A stand-in for a user's own JupyterLab, run by playwright.config.js on the port the UI tests
 * once took (8891): every request gets the token page such a server shows to a browser
 * without its token. The UI tests must never reach it; own_server.spec.ts checks they do not.
 *
 * Usage: node user_server.js PORT
 */
const http = require('http');

const port = Number(process.argv[2]);
const PAGE = `<!doctype html>
<html>
  <head><title>Jupyter Server</title></head>
  <body>
    <h1>Token authentication is enabled</h1>
    <p>A user's own JupyterLab (a stand-in run by the jupyter-gpumem UI tests).</p>
    <form action="/login" method="post"><input name="password" type="password" /></form>
  </body>
</html>
`;

function answer(request, response) {
  response.writeHead(200, { 'Content-Type': 'text/html', 'X-Gpumem-Stand-In': 'user-server' });
  response.end(PAGE);
}

// On both loopback addresses, as JupyterLab listens on `localhost`; IPv6 may be missing.
http.createServer(answer).listen(port, '127.0.0.1');
http
  .createServer(answer)
  .on('error', () => {})
  .listen(port, '::1');
