"""Infrastructure: config, artifacts and run identity, tables' schemas, seeding, tracking, locks."""
