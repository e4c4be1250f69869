"""Deadline propagation over HTTP: the server middlewares and the client adapters.

Servers: :mod:`._asgi`, :mod:`._wsgi`, both reading the caller's deadline through
:mod:`._server`. Clients: :mod:`._httpx`, :mod:`._requests`, :mod:`._aiohttp`, each taking its
attempts from :mod:`timebound.propagation._client`. Users import them by their public names,
:mod:`timebound.propagation.asgi`, :mod:`timebound.propagation.httpx` and so on; the wire format
they share with gRPC is :mod:`timebound.propagation._codec`.
"""

__all__: list[str] = []  # a room: its names are public through the modules beside it
