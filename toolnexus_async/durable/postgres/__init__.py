"""The PostgreSQL run store: one database that any number of workers share."""
