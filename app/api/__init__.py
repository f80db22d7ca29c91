"""The HTTP layer: FastAPI factory, lifespan, middleware, auth, errors, routers, schemas."""
