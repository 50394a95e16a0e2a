"""``coffea-sonic serve`` and ``coffea-sonic models export``: command-line front of the server package."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from .. import zoo

logger = logging.getLogger(__name__)


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``models`` on the top-level CLI."""
    serve = subparsers.add_parser(
        "serve",
        help="start the embedded real Triton server on this machine",
        description=(
            "Start the real tritonserver shipped in the nvidia-pytriton wheel over a config.pbtxt "
            "repository of the zoo models (or your own --repository), and keep it running until "
            "Ctrl-C / SIGTERM. Ports given as 0 are picked free and printed.\n\n"
            "examples:\n"
            "  coffea-sonic serve                          # all zoo models, default ports\n"
            "  coffea-sonic serve --models jet_tagger --grpc-port 0\n"
            "  coffea-sonic serve --device gpu --host 0.0.0.0   # serve a facility node's GPU\n"
            "  coffea-sonic serve --repository ./my_models"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--models", nargs="+", choices=zoo.names(), metavar="NAME",
                       help=f"zoo models to serve (default: all of {', '.join(zoo.names())})")
    serve.add_argument("--repository", help="serve this existing Triton model repository instead")
    serve.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                       help="where the zoo models run (auto: GPU if nvidia-smi sees one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0 to let worker nodes connect)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="gRPC port, 0 = pick a free one")
    serve.add_argument("--http-port", type=int, default=8000, help="HTTP port, 0 = pick a free one")
    serve.add_argument("--metrics-port", type=int, default=8002,
                       help="Prometheus metrics port, 0 = pick a free one")
    serve.add_argument("--instances", type=int, default=None,
                       help="model instances per device (default: 4 on GPU, 1 on CPU)")
    serve.add_argument("--startup-timeout", type=float, default=120.0, metavar="SECONDS")
    serve.set_defaults(func=run_serve)

    models = subparsers.add_parser(
        "models", help="list the model zoo or export a Triton model repository",
        description="Inspect the zoo, or write a standard Triton model repository for it.")
    actions = models.add_subparsers(dest="models_command", required=True)
    listing = actions.add_parser("list", help="list zoo models with inputs and outputs")
    listing.set_defaults(func=run_models_list)
    export = actions.add_parser(
        "export", help="write a Triton model repository (config.pbtxt + version folder)",
        description=(
            "Write a standard Triton model repository. The python variant runs with the embedded "
            "server (onnxruntime on CPU, torch on CUDA for --device gpu); the onnxruntime variant "
            "(platform onnxruntime_onnx) is what a facility's official NVIDIA Triton container "
            "serves.\n\nexample:\n  coffea-sonic models export ./repo --backend onnxruntime --device gpu"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("directory", help="where to write the repository")
    export.add_argument("--backend", choices=("python", "onnxruntime"), default="python")
    export.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    export.add_argument("--models", nargs="+", choices=zoo.names(), metavar="NAME",
                        help="zoo models to export (default: all)")
    export.add_argument("--instances", type=int, default=1, help="instance_group count")
    export.add_argument("--tensorrt", action="store_true",
                        help="onnxruntime on GPU: enable the TensorRT execution accelerator")
    export.set_defaults(func=run_models_export)


def run_serve(args: argparse.Namespace) -> int:
    from .launcher import LocalTritonServer

    server = LocalTritonServer(
        models=args.models, repository=args.repository, device=args.device,
        grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
        host=args.host, instances=args.instances, startup_timeout_s=args.startup_timeout)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started = time.monotonic()
    with server:
        models = args.models or ([] if args.repository else zoo.names())
        print(f"coffea-sonic server ready in {time.monotonic() - started:.1f} s "
              f"(device {server.device}, pid {server.pid})", flush=True)
        print(f"  gRPC     {server.grpc_address}", flush=True)
        print(f"  HTTP     {server.http_address}", flush=True)
        print(f"  metrics  {server.metrics_url}", flush=True)
        for name in models:
            print(f"  model    {server.url(name)}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                print(f"tritonserver exited unexpectedly; log tail:\n{server.log_tail()}", flush=True)
                return 1
    print("server stopped", flush=True)
    return 0


def run_models_list(args: argparse.Namespace) -> int:
    for name in zoo.names():
        model_spec = zoo.spec(name)
        print(f"{name}: {model_spec.description}")
        for kind, tensors in (("in ", model_spec.inputs), ("out", model_spec.outputs)):
            for tensor in tensors:
                print(f"    {kind} {tensor.name:12s} {tensor.dtype} {list(tensor.dims)}")
        print(f"    max_batch_size {model_spec.max_batch_size}")
    return 0


def run_models_export(args: argparse.Namespace) -> int:
    from .repository import write_repository

    path = write_repository(args.directory, args.models, backend=args.backend, device=args.device,
                            instances=args.instances, tensorrt=args.tensorrt)
    print(f"wrote Triton model repository {path} ({args.backend} backend, {args.device})")
    return 0
