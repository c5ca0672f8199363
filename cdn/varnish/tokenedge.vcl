vcl 4.1;
# tokenedge edge cache for Varnish 7.1 (varnish-modules 0.20: bodyaccess, xkey). A template: render it with
# `python -m cdn.varnish.render --backend HOST:PORT ...` (cdn/README.md "Varnish"); {{...}} are its parameters.
#
# What is cached: POST /v1/chat/completions, /v1/completions, /v1/embeddings keyed by URL + Host + the tenant
# credential + the request body, and GET /v1/cache/{key} (the alias) keyed by URL + Host (+ credential for
# tenant keys). Only 200 answers that the gateway marks for the edge (Surrogate-Control or CDN-Cache-Control
# with max-age > 0, no no-store) are stored; everything else is hit-for-miss, so bypasses and errors never are.
# Tenant answers are marked so only when the gateway runs with cache.cdn_credential_keyed_edge = true, which this
# config allows because vcl_hash keys by every credential part (docs/deployment.md "Behind a CDN").
#
# RFC 9110 §9.3.3 does not let a cached POST answer a later POST: this is a private arrangement between the
# gateway and this config, safe because the gateway decides cacheability and the key holds the full body.

import std;
import bodyaccess;
import xkey;

backend gateway {
    .host = "{{backend_host}}";
    .port = "{{backend_port}}";
    .connect_timeout = 2s;
    .first_byte_timeout = 300s;   # long generations
    .between_bytes_timeout = 120s;
}

acl purgers {
    "127.0.0.1";
    "::1";
{{purge_acl}}
}

sub vcl_recv {
    if (req.restarts == 0) {
        # Internal state travels in X-TE-* request headers; never trust a client's copy.
        unset req.http.X-TE-Method;
        unset req.http.X-TE-Status;
        unset req.http.X-TE-Failed;
        unset req.http.X-TE-Gone;
    }
    if (req.method == "PURGE" || req.method == "BAN") {
        call tokenedge_purge;
    }
    if (req.restarts > 0 && req.http.X-TE-Failed) {
        # Stale-if-error (RFC 5861 §4): the gateway failed; a stale copy within its grace may answer now.
        set req.grace = 24h;
    } else {
        # Otherwise grace is not stale-while-revalidate: a stale object is a miss, refetched in the foreground.
        set req.grace = 0s;
    }
    if (req.method == "POST" && req.url ~ "^/v1/(chat/completions|completions|embeddings)/?(\?.*)?$") {
        call tokenedge_body;
        if (req.http.Cache-Control ~ "(?i)no-store") {
            set req.http.X-TE-Status = "varnish; fwd=bypass; detail=no-store";
            return (pass);
        }
        if ({{stream_bypass}} && bodyaccess.rematch_req_body({""stream"\s*:\s*true"}) != 0) {
            # SSE answers are relayed as they flow; the gateway marks them no-store anyway.
            set req.http.X-TE-Status = "varnish; fwd=bypass; detail=stream";
            return (pass);
        }
        set req.http.X-TE-Method = "POST";
        call tokenedge_freshness;
        return (hash);
    }
    if ((req.method == "GET" || req.method == "HEAD") && req.url ~ "^/v1/cache/[^/?]+$") {
        call tokenedge_freshness;
        return (hash);
    }
    # Everything else (models, admin, metrics, other /v1 routes) goes to the gateway untouched.
    set req.http.X-TE-Status = "varnish; fwd=bypass";
    return (pass);
}

sub tokenedge_body {
    # 413 before reading: a declared length over the limit, then the actual bytes (chunked bodies too).
    if (std.integer(req.http.Content-Length, 0) > {{max_body_bytes}}) {
        return (synth(413, "Request body too large"));
    }
    if (!std.cache_req_body({{max_body_bytes}}B)) {
        return (synth(413, "Request body too large"));
    }
}

sub tokenedge_freshness {
    # The client's no-cache (RFC 9111 §5.2.1.4) refetches and stores the fresh answer.
    if (req.http.Cache-Control ~ "(?i)no-cache" || (!req.http.Cache-Control && req.http.Pragma ~ "(?i)no-cache")) {
        set req.hash_always_miss = true;
    }
}

sub tokenedge_purge {
    if (client.ip !~ purgers) {
        return (synth(403, "Forbidden"));
    }
{{purge_token_check}}
    if (req.method == "BAN") {
        if (!req.http.X-Ban-Tags) {
            return (synth(400, "BAN needs X-Ban-Tags"));
        }
        # One ban for all tags: each tag regex-quoted, alternated, matched as a whole xkey token.
        set req.http.X-TE-Gone = regsuball(req.http.X-Ban-Tags, {"([][\\^$.|?*+(){}])"}, {"\\\1"});
        set req.http.X-TE-Gone = regsuball(regsuball(req.http.X-TE-Gone, "^\s+|\s+$", ""), "\s+", "|");
        ban("obj.http.xkey ~ (^|\s)(" + req.http.X-TE-Gone + ")(\s|$)");
        return (synth(200, "Banned"));
    }
    if (req.http.xkey-purge) {
        set req.http.X-TE-Gone = xkey.purge(req.http.xkey-purge);
    } elsif (req.http.xkey-softpurge) {
        set req.http.X-TE-Gone = xkey.softpurge(req.http.xkey-softpurge);
    } else {
        return (synth(400, "PURGE needs xkey-purge or xkey-softpurge"));
    }
    return (synth(200, "Purged " + req.http.X-TE-Gone));
}

sub vcl_hash {
    hash_data(req.url);
    if (req.http.Host) {
        hash_data(req.http.Host);
    } else {
        hash_data(server.ip);
    }
    # Every credential part: the gateway scopes entries by all of them (Authorization of any scheme, api-key,
    # x-api-key, OpenAI-Organization, OpenAI-Project), so the edge must too. Public alias keys are served by the
    # gateway to anyone and are shared.
    if (req.url !~ "^/v1/cache/te1:pub:") {
        hash_data("authorization:" + req.http.Authorization);
        hash_data("api-key:" + req.http.api-key);
        hash_data("x-api-key:" + req.http.x-api-key);
        hash_data("openai-organization:" + req.http.OpenAI-Organization);
        hash_data("openai-project:" + req.http.OpenAI-Project);
{{tenant_hash}}
    }
    if (req.http.X-TE-Method == "POST") {
        hash_data("POST");
        bodyaccess.hash_req_body();
    }
    return (lookup);
}

sub vcl_hit {
    set req.http.X-TE-Status = "varnish; hit; ttl=" + std.integer(duration=obj.ttl, fallback=0);
    if (obj.ttl <= 0s) {
        set req.http.X-TE-Status = req.http.X-TE-Status + "; detail=stale-if-error";
    }
}

sub vcl_miss {
    set req.http.X-TE-Status = "varnish; fwd=miss";
    if (req.restarts > 0 && req.http.X-TE-Failed) {
        # Nothing stale to fall back on: report the gateway's failure rather than fetch again.
        return (synth(std.integer(req.http.X-TE-Failed, 503), "Backend fetch failed"));
    }
}

sub vcl_backend_fetch {
    # A cache miss is fetched as GET by default: send the client's POST and its cached body.
    if (bereq.http.X-TE-Method) {
        set bereq.method = bereq.http.X-TE-Method;
    }
    unset bereq.http.X-TE-Method;
    unset bereq.http.X-TE-Status;
    unset bereq.http.X-TE-Failed;
    unset bereq.http.X-TE-Gone;
}

sub vcl_backend_response {
    # Edge freshness comes from Surrogate-Control, then CDN-Cache-Control (RFC 9213), then s-maxage
    # (the builtin parse of Cache-Control, already in beresp.ttl). beresp.ttl counts from the origin's Age.
    if (beresp.http.Surrogate-Control) {
        set beresp.http.X-TE-Edge = beresp.http.Surrogate-Control;
    } elsif (beresp.http.CDN-Cache-Control) {
        set beresp.http.X-TE-Edge = beresp.http.CDN-Cache-Control;
    }
    if (beresp.status != 200 || beresp.http.Set-Cookie || beresp.http.Vary == "*"
        || beresp.http.X-TE-Edge ~ "(?i)no-store|private"
        || (!beresp.http.X-TE-Edge && beresp.http.Cache-Control !~ "(?i)s-maxage=[1-9]")) {
        if (beresp.status >= 500) {
            # Keep any stale copy (stale-if-error): insert nothing, let vcl_synth/vcl_deliver restart.
            return (abandon);
        }
        unset beresp.http.X-TE-Edge;
        # Hit-for-miss: the next request is fetched too (not coalesced), and a cacheable answer replaces it.
        set beresp.uncacheable = true;
        set beresp.ttl = 10s;
        set beresp.grace = 0s;
        return (deliver);
    }
    if (beresp.http.X-TE-Edge) {
        set beresp.ttl = std.duration(regsub(beresp.http.X-TE-Edge, "^(?i).*\bmax-age=([0-9]+).*$", "\1") + "s",
                                      0s);
        set beresp.grace = std.duration(
            regsub(beresp.http.X-TE-Edge, "^(?i).*\bstale-if-error=([0-9]+).*$", "\1") + "s", 0s);
        unset beresp.http.X-TE-Edge;
    }
    if (beresp.ttl <= 0s) {
        set beresp.uncacheable = true;
        set beresp.ttl = 10s;
        set beresp.grace = 0s;
    }
    return (deliver);
}

sub vcl_backend_error {
    # Connection refused or timed out: no stale object is replaced; the client side restarts for grace.
    return (abandon);
}

sub vcl_deliver {
    if (resp.status >= 500 && req.restarts == 0 && req.http.X-TE-Method) {
        set req.http.X-TE-Failed = resp.status;
        return (restart);
    }
    if (req.http.X-TE-Status ~ "fwd=miss" && !obj.uncacheable) {
        set req.http.X-TE-Status = req.http.X-TE-Status + "; stored";
    }
    if (obj.uncacheable) {
        unset resp.http.Age;  # design §5: a bypass carries no Age
    }
    # RFC 9211 §2: caches closest to the origin first, so the gateway's entry precedes ours.
    if (resp.http.Cache-Status) {
        set resp.http.Cache-Status = resp.http.Cache-Status + ", " + req.http.X-TE-Status;
    } else {
        set resp.http.Cache-Status = req.http.X-TE-Status;
    }
}

sub vcl_synth {
    if (resp.status >= 500 && req.restarts == 0 && req.http.X-TE-Method) {
        # An abandoned fetch (gateway down or 5xx): retry the lookup once, allowing a stale copy.
        set req.http.X-TE-Failed = resp.status;
        return (restart);
    }
    if (resp.status == 413) {
        set resp.http.Connection = "close";  # the rest of an oversized body is never read
    }
    if (req.method == "PURGE" || req.method == "BAN") {
        set resp.http.Content-Type = "text/plain; charset=utf-8";
        set resp.body = resp.reason;
        return (deliver);
    }
    set resp.http.Content-Type = "application/json";
    set resp.http.Cache-Control = "no-store";
    set resp.http.Cache-Status = "varnish; fwd=bypass; detail=" + resp.status;
    set resp.body = {"{"error": {"message": ""} + resp.reason + {"", "type": "edge_error", "param": null, "code": "edge_"} + resp.status + {"""} + "}}";
    return (deliver);
}
