"""Entry points: what each Lambda role runs, one module per role.

``functions/<role>/app.py`` holds only decorators and one call into ``<role>.handle``; the
module here parses the invocation at the edge, builds the runtime once per process (one
warm container) and drives it on the process's one event loop.
"""
