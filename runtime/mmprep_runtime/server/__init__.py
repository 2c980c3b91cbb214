"""The aiohttp server around the APIs: the app and its routes, admission, health, metrics, the
engine's start in the background, and the drain's phases from SIGTERM to exit.
"""
