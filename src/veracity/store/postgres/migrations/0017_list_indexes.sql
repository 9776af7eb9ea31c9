-- 0017: on SQLite, the list's indexes of one status, one deployment and one workflow name
-- (its 0017 says why). PostgreSQL has had them since 0012: nothing changes here.
SELECT 1;
