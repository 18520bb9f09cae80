"""The gateway's HTTP surface: the provider routes, errors in each provider's shape, keep-alive and streamed
responses, health, session and admin routes, the access log."""
