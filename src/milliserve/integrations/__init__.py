"""milliserve on other engines: ``milliserve.integrations.ray`` (Ray Serve). Each module
imports its engine only when used."""
