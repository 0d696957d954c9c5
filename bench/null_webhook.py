"""A webhook that does no work: the floor any mutating webhook pays on this machine.

    .venv/bin/python bench/null_webhook.py --port P --cert-file F --key-file K

Answers every AdmissionReview at once, allowing the pod with a fixed JSON
patch that adds one init container (the same kind of change the operator's
webhook makes), in a process of its own. bench/webhook_latency.py registers
it for a namespace of its own beside the operator's, so one run shows what
the API server's call to *a* webhook costs and what the operator's adds.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl

from aiohttp import web

PATCH = base64.b64encode(
    json.dumps(
        [
            {
                "op": "add",
                "path": "/spec/initContainers",
                "value": [{"name": "null-webhook", "image": "example.com/wait:1"}],
            }
        ]
    ).encode()
).decode()


async def review(request: web.Request) -> web.Response:
    """Allow, with the fixed patch."""
    body = await request.json()
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": body["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": PATCH,
        },
    }
    return web.json_response(answer)


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    args = parser.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert_file, args.key_file)
    app = web.Application()
    app.router.add_post("/mutate", review)
    web.run_app(app, host="127.0.0.1", port=args.port, ssl_context=context, access_log=None)


if __name__ == "__main__":
    main()
