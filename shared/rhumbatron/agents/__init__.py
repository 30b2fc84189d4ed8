"""Agent runtimes: how a woken Agent does its Task (scripted locally, or a signed webhook)."""
