-- 0010: scoped API tokens (docs/security.md). A token is kept as the SHA-256 of the whole
-- token, never the token; key_id, the public part of the token, finds its row. Tokens are
-- never deleted: a revoked one stays listed, and its name is never given out again.

CREATE TABLE veracity_api_tokens (
    name         TEXT PRIMARY KEY
                 CHECK (length(name) BETWEEN 1 AND 64
                        AND name NOT GLOB '*[^A-Za-z0-9._-]*'
                        AND substr(name, 1, 1) GLOB '[A-Za-z0-9]'),
    key_id       TEXT NOT NULL UNIQUE
                 CHECK (length(key_id) = 16 AND key_id NOT GLOB '*[^0-9a-f]*'),
    token_hash   TEXT NOT NULL
                 CHECK (length(token_hash) = 64 AND token_hash NOT GLOB '*[^0-9a-f]*'),
    scopes       TEXT NOT NULL
                 CHECK (json_type(scopes) = 'array' AND json_array_length(scopes) >= 1),
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER CHECK (expires_at > created_at),
    revoked_at   INTEGER,
    last_used_at INTEGER
) STRICT;
