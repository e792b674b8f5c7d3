"""The filesystem the server acts on: the workspace, and the sandbox user's home.

Modules:

  paths  workspace paths resolved through directory descriptors, never by name after a check;
         a tree deleted the same way
  home   the sandbox user's home, made and seeded from the image's caches at start
"""
