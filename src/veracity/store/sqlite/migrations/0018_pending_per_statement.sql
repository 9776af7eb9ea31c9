-- 0018: on PostgreSQL, an insert's notification to waiting workers is made once per
-- statement (its 0018 says why). SQLite has no notifications: nothing changes here.
SELECT 1;
