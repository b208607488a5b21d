import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import { RolloutError } from '../errors.ts';
import { errorResponses } from './wire.ts';

// Swagger UI from the swagger-ui-dist package, served by the service itself: no CDN, works offline.
// Found on the first request for it: the package is an optional peer dependency of core (@rollserve/cli
// installs it), so what imports the API without serving it does without the package.
let swaggerDir: string | undefined;
function swaggerFile(asset: string): string {
  try {
    swaggerDir ??= dirname(createRequire(import.meta.url).resolve('swagger-ui-dist/package.json'));
  } catch (error) {
    throw new RolloutError({ code: 'NOT_FOUND', message: 'the API docs need the swagger-ui-dist package: install it beside @rollserve/core (@rollserve/cli depends on it)', cause: error });
  }
  return join(swaggerDir, asset);
}
const ASSETS: Record<string, string> = {
  'swagger-ui.css': 'text/css; charset=utf-8',
  'index.css': 'text/css; charset=utf-8',
  'swagger-ui-bundle.js': 'text/javascript; charset=utf-8',
  'swagger-ui-standalone-preset.js': 'text/javascript; charset=utf-8',
  'favicon-32x32.png': 'image/png',
  'favicon-16x16.png': 'image/png',
};

// Relative URLs: from /docs, `docs/x` is /docs/x and `openapi.json` is /openapi.json (also under a prefix).
const PAGE = `<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="UTF-8">
    <title>rollserve rollout service API</title>
    <link rel="stylesheet" type="text/css" href="docs/swagger-ui.css" />
    <link rel="stylesheet" type="text/css" href="docs/index.css" />
    <link rel="icon" type="image/png" href="docs/favicon-32x32.png" sizes="32x32" />
    <link rel="icon" type="image/png" href="docs/favicon-16x16.png" sizes="16x16" />
  </head>
  <body>
    <div id="swagger-ui"></div>
    <script src="docs/swagger-ui-bundle.js" charset="UTF-8"></script>
    <script src="docs/swagger-ui-standalone-preset.js" charset="UTF-8"></script>
    <script src="docs/init.js" charset="UTF-8"></script>
  </body>
</html>
`;

const INIT = `window.onload = function () {
  window.ui = SwaggerUIBundle({
    url: new URL('openapi.json', window.location.href).href,
    dom_id: '#swagger-ui',
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: 'StandaloneLayout',
  });
};
`;

const pageRoute = createRoute({
  method: 'get',
  path: '/docs',
  summary: 'This document, browsable (Swagger UI, served offline)',
  security: [],
  responses: { 200: { description: 'An HTML page', content: { 'text/html': { schema: z.string() } } } },
});

const slashRoute = createRoute({
  method: 'get',
  path: '/docs/',
  summary: 'Redirects to /docs',
  security: [],
  responses: { 308: { description: 'To /docs (`Location: ../docs`)' } },
});

const assetRoute = createRoute({
  method: 'get',
  path: '/docs/{asset}',
  summary: "The page's scripts, styles and icons",
  security: [],
  request: { params: z.object({ asset: z.string().openapi({ param: { name: 'asset', in: 'path' }, example: 'swagger-ui.css' }) }) },
  responses: {
    200: {
      description: 'The file',
      content: { 'text/css': { schema: z.string() }, 'text/javascript': { schema: z.string() }, 'image/png': { schema: z.string().openapi({ format: 'binary' }) } },
    },
    ...errorResponses(404),
  },
});

/** GET /docs: Swagger UI over /openapi.json. */
export function docsApi(): OpenAPIHono {
  const app = new OpenAPIHono();
  app.openapi(pageRoute, (c) => c.html(PAGE, 200));
  // The page's URLs are relative to /docs; from /docs/ they would miss. Relative, so also under a prefix.
  app.openapi(slashRoute, (c) => c.redirect('../docs', 308));
  app.openapi(assetRoute, async (c) => {
    const { asset } = c.req.valid('param');
    if (asset === 'init.js') return c.body(INIT, 200, { 'content-type': 'text/javascript; charset=utf-8' });
    const type = Object.hasOwn(ASSETS, asset) ? ASSETS[asset] : undefined;
    if (!type) throw new RolloutError({ code: 'NOT_FOUND', message: `no docs asset "${asset}"` });
    return c.body(await readFile(swaggerFile(asset)), 200, { 'content-type': type, 'cache-control': 'public, max-age=3600' });
  });
  return app;
}
