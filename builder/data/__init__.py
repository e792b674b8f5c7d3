"""Distro and base knowledge shipped as data files, each with the script that regenerates it."""
