-- 0021: on SQLite, the list's name and deployment indexes are keyed on the status too, as
-- they are here since 0020 (SQLite's 0021 says why). Nothing changes here.
SELECT 1;
