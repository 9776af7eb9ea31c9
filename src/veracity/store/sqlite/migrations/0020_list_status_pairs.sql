-- 0020: on PostgreSQL, the list's name and deployment indexes are keyed on the status too
-- (its 0020 says why). SQLite reads a combination of filters from whichever one's index
-- holds the fewest entries in the page's range (docs/operations.md, What a list page
-- costs): nothing changes here.
SELECT 1;
