"""``python3 -I /opt/sandbox/server`` runs this file: it starts the sandbox runtime server.

The directory holds this file and the ``sandbox_server`` package only, because it is
``sys.path[0]``, ahead of the standard library: any other module here could shadow a stdlib one.
"""

import sys

from sandbox_server.main import main

sys.exit(main())
