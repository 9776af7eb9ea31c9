"""The PostgreSQL store (psycopg 3 with an async connection pool)."""

from veracity.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
