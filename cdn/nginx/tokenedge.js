// tokenedge cache key for nginx (njs 0.7+): one SHA-256 over method, host, URI, the tenant credential and,
// for POST, the body bytes. An empty string means "do not cache": a body nginx could not hold in memory
// (written to a temp file) or an empty POST body, so two bodies can never collide on one key.
var crypto = require('crypto');
var PURGE_PREFIX = '/tokenedge-purge/';

function cache_key(r) {
    var method = r.method === 'HEAD' ? 'GET' : r.method;
    var uri = r.variables.request_uri;
    if (uri.startsWith(PURGE_PREFIX)) {
        // The purge location recomputes the key of `GET <alias URL>` for the same credential.
        method = 'GET';
        uri = uri.slice(PURGE_PREFIX.length - 1);
    }
    var h = crypto.createHash('sha256');
    h.update('te-nginx-1\n' + method + '\n' + (r.headersIn.Host || '') + '\n' + uri + '\n');
    // Public alias keys (te1:pub:...) are served by the gateway to anyone; everything else is per tenant.
    if (!(method === 'GET' && uri.startsWith('/v1/cache/te1:pub:'))) {
        // Every credential part the gateway scopes by, so two callers the upstream tells apart never share.
        var parts = ['Authorization', 'api-key', 'x-api-key', 'OpenAI-Organization', 'OpenAI-Project'];
        for (var i = 0; i < parts.length; i++) {
            h.update(parts[i] + ':' + (r.headersIn[parts[i]] || '') + '\n');
        }
        var tenant = r.variables.tokenedge_tenant_header;
        if (tenant) {
            h.update('tenant:' + tenant + '\n');
        }
    }
    if (method === 'POST') {
        var body;
        try {
            body = r.requestBuffer;  // throws when the body went to a temp file
        } catch (e) {
            return '';
        }
        if (body === undefined || body.length === 0) {
            return '';
        }
        h.update('body:' + body.length + '\n');
        h.update(body);
    }
    return h.digest('hex');
}

export default { cache_key };
