// A real OpenID Provider for the SSO tests: panva's certified `oidc-provider`,
// with a small login page of our own and an account store read from a JSON file
// at every use, so a test changes a person's groups (or the token lifetimes) by
// rewriting that file between two sign-ins.
//
//   node provider.mjs  (configured by the environment, see below)
//
// OIDC_TEST_PORT           port on 127.0.0.1
// OIDC_TEST_DIRECTORY      JSON: {"accounts": {"<sub>": {"username", "password", "email",
//                          "groups": [...]}}, "ttl": {"IdToken": s, "AccessToken": s},
//                          "clock_offset_seconds": s}
// OIDC_TEST_CLIENT_ID, OIDC_TEST_CLIENT_SECRET
// OIDC_TEST_REDIRECT_URIS, OIDC_TEST_POST_LOGOUT_URIS   comma-separated
//
// Prints "listening <issuer>" once it accepts connections.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import http from 'node:http';

import Provider from 'oidc-provider';

const port = Number(process.env.OIDC_TEST_PORT);
const issuer = `http://127.0.0.1:${port}`;
const directoryPath = process.env.OIDC_TEST_DIRECTORY;
const clientId = process.env.OIDC_TEST_CLIENT_ID;

let cached = { mtimeMs: -1, value: null };
function directory() {
  const { mtimeMs } = statSync(directoryPath);
  if (mtimeMs !== cached.mtimeMs) {
    cached = { mtimeMs, value: JSON.parse(readFileSync(directoryPath, 'utf8')) };
  }
  return cached.value;
}

// "clock_offset_seconds" in the directory sets this provider's clock off by that
// much: a clock 120 s behind mints ID tokens that are already expired when the
// relying party checks them, as a provider with a wrong clock would.
const realNow = Date.now;
Date.now = () => realNow() + (directory().clock_offset_seconds ?? 0) * 1000;

function ttl(kind, fallback) {
  return () => directory().ttl?.[kind] ?? fallback;
}

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title></head>
<body><main><h1>Test identity provider</h1>${body}</main></body></html>`;
}

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key', alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: process.env.OIDC_TEST_CLIENT_SECRET,
    redirect_uris: process.env.OIDC_TEST_REDIRECT_URIS.split(','),
    post_logout_redirect_uris: process.env.OIDC_TEST_POST_LOGOUT_URIS.split(','),
    // refresh_token: the registry's periodic check (sso/checks.py) redeems one.
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  jwks: { keys: [signingKey] },
  // A refresh token at every code exchange, as a provider does for the scope
  // offline_access (which oidc-provider honours only with a consent prompt).
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  cookies: { keys: [randomBytes(32).toString('hex')] },
  // A confidential client must still use PKCE here: the RP is tested to send it.
  pkce: { required: () => true },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    // oid: an immutable object id, as Entra ID sends (tests of OIDC_LINK_CLAIM).
    profile: ['name', 'preferred_username', 'oid'],
    groups: ['groups'],
  },
  scopes: ['openid', 'groups'],
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.body = page('Sign out', `${form}<p>Sign out of the test identity provider?</p>
<button type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>`);
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = page('Signed out', '<p>You are signed out.</p>');
      },
    },
  },
  ttl: {
    IdToken: ttl('IdToken', 3600),
    AccessToken: ttl('AccessToken', 3600),
    AuthorizationCode: 60,
    Interaction: 600,
    Session: 3600,
    Grant: 3600,
  },
  async findAccount(ctx, sub) {
    const account = directory().accounts[sub];
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        // Re-read: the test may have changed the groups since the session began.
        const now = directory().accounts[sub] || account;
        return {
          sub,
          email: now.email,
          email_verified: true,
          name: now.name || now.username,
          preferred_username: now.username,
          groups: now.groups || [],
          ...(now.oid ? { oid: now.oid } : {}),
        };
      },
    };
  },
  // A first-party client: no consent screen, the requested scopes are granted.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(ctx.oidc.params.scope);
    await grant.save();
    return grant;
  },
  async renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = page('Error', Object.entries(out)
      .map(([key, value]) => `<p><strong>${escape(key)}</strong>: ${escape(value)}</p>`).join(''));
  },
});

function loginForm(uid, error = '') {
  return page('Sign in', `${error ? `<p role="alert">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
  <label>Username <input name="username" autocomplete="username"></label>
  <label>Password <input name="password" type="password" autocomplete="current-password"></label>
  <button type="submit">Sign in</button>
</form>`);
}

async function readForm(req) {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 10_000) throw new Error('form too large');
  }
  return new URLSearchParams(body);
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    res.setHeader('Content-Type', 'text/html; charset=utf-8');
    res.end(loginForm(details.uid));
    return;
  }
  const form = await readForm(req);
  const found = Object.entries(directory().accounts)
    .find(([, a]) => a.username === form.get('username') && a.password === form.get('password'));
  if (!found) {
    res.statusCode = 401;
    res.setHeader('Content-Type', 'text/html; charset=utf-8');
    res.end(loginForm(details.uid, 'Wrong username or password.'));
    return;
  }
  await provider.interactionFinished(req, res, { login: { accountId: found[0] } }, {
    mergeWithLastSubmission: false,
  });
}

const handler = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((error) => {
      res.statusCode = 400;
      res.end(page('Error', `<p>${escape(error.message)}</p>`));
    });
    return;
  }
  handler(req, res);
}).listen(port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
