"""The aiohttp server around the APIs: the app and its routes, admission, health, metrics, and the
engine's start in the background.
"""
