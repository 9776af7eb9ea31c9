-- 0010: scoped API tokens (docs/security.md). A token is kept as the SHA-256 of the whole
-- token, never the token; key_id, the public part of the token, finds its row. Tokens are
-- never deleted: a revoked one stays listed, and its name is never given out again.

CREATE TABLE veracity_api_tokens (
    name         text PRIMARY KEY
                 CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    key_id       text NOT NULL UNIQUE CHECK (key_id ~ '^[0-9a-f]{16}$'),
    token_hash   text NOT NULL CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    scopes       json NOT NULL
                 CHECK (json_typeof(scopes) = 'array' AND json_array_length(scopes) >= 1),
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz CHECK (expires_at > created_at),
    revoked_at   timestamptz,
    last_used_at timestamptz
);
