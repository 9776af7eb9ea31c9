-- 0014: on PostgreSQL, veracity_executions' CHECK constraints became one function, because
-- PostgreSQL parses every CHECK's stored text again for each statement. SQLite compiles a
-- table's CHECKs with the statement it prepares and keeps them: nothing to change here. The
-- number is kept so that both backends' migrations stay in step (tests/test_migrate.py).
SELECT 1;
