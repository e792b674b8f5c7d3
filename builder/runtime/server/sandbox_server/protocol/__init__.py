"""HTTP/1.1 as the server speaks it, apart from what the requests mean (``app`` holds that).

Modules:

  framing  a request's line, headers and body within their deadlines: Content-Length and chunked
           bodies, ``Expect: 100-continue``, draining or lingering close, every error as JSON
  forms    multipart/form-data read as a stream, and header parameters (``boundary``,
           ``filename``)
"""
