"""The broker's servers: each translates one wire protocol into core calls."""
