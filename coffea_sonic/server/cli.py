"""``coffea-sonic serve`` and ``coffea-sonic models list|export|add|validate``: the server package's CLI."""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

from .. import zoo
from ..cliargs import (add_deprecated_alias, add_device_option, add_json_option, add_list_option,
                       add_output_option, print_json, resolve_device, warn_deprecated)
from ..errors import SonicError, UnservableModelError

logger = logging.getLogger(__name__)


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``models`` on the top-level CLI."""
    _add_serve(subparsers)
    _add_models(subparsers)


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
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
            "  coffea-sonic serve --repository ./my_models --grpc-port 0\n"
            "  coffea-sonic serve --repository ./facility_repo --skip-unservable\n\n"
            "A --repository written for NVIDIA's official Triton container is served as it is\n"
            "(ONNX and TorchScript through python-backend adapters; your files are not touched).\n"
            "Check one first with: coffea-sonic models validate ./my_models"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_list_option(serve, "--models", choices=zoo.names() + zoo.pipeline_names(),
                       help=f"zoo models to serve (default: all of {', '.join(zoo.names())}; "
                            f"pipelines when named: {', '.join(zoo.pipeline_names())})")
    serve.add_argument("--repository", metavar="DIR",
                       help="serve this Triton model repository (e.g. from `models add`) instead")
    serve.add_argument("--skip-unservable", action="store_true",
                       help="with --repository: serve the models the embedded server can run and "
                            "list the others (TensorRT, TensorFlow, ...) instead of refusing to start")
    add_device_option(serve, default="auto",
                       help="where the zoo models run (auto: GPU if nvidia-smi sees one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0 to let worker nodes connect)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="gRPC port, 0 = pick a free one")
    serve.add_argument("--http-port", type=int, default=8000, help="HTTP port, 0 = pick a free one")
    serve.add_argument("--metrics-port", type=int, default=8002,
                       help="Prometheus metrics port, 0 = pick a free one")
    serve.add_argument("--instances", type=int, default=None,
                       help="model instances per device (default: 6 per GPU, 1 on CPU; "
                            "the pipelines' models: 1 per GPU)")
    add_list_option(serve, "--gpus", type=_gpu_index, metavar="GPU",
                       help="GPUs to serve on (default: every visible GPU, each with --instances "
                            "model instances)")
    add_list_option(serve, "--torch-ops-library", split_commas=False, metavar="PATH", default=[],
                    help="with --repository: shared libraries of custom TorchScript operators "
                         "(e.g. torch_sparse's) that models need")
    startup = serve.add_argument(
        "--startup-timeout-s", type=float, default=120.0, metavar="SECONDS",
        help="seconds the server gets to become ready (default: %(default)s)")
    add_deprecated_alias(serve, "--startup-timeout", startup)
    serve.add_argument("--response-cache", metavar="SIZE",
                       help="Triton's response cache of SIZE (e.g. 512MB): identical requests are "
                            "answered without running the model; the zoo's models use it, a "
                            "repository's models where their config says response_cache { enable: "
                            "true } (models add --response-cache). Default: off")
    serve.set_defaults(func=run_serve)


def _add_models(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser(
        "models", help="the model zoo; add your own model to a repository; validate a repository",
        description=_help(
            "Inspect the zoo or export it as a Triton model repository; add your own ONNX or "
            "TorchScript file to a repository; validate a repository before serving it.",
            examples=("coffea-sonic models list",
                      "coffea-sonic models add tagger.onnx --name tagger -o ./repo",
                      "coffea-sonic models validate ./repo",
                      "coffea-sonic serve --repository ./repo")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = models.add_subparsers(dest="models_command", required=True)
    listing = actions.add_parser("list", help="list zoo models with inputs and outputs")
    add_json_option(listing)
    listing.set_defaults(func=run_models_list)
    _add_models_export(actions)
    _add_models_add(actions)
    _add_models_validate(actions)


def _add_models_export(actions: argparse._SubParsersAction) -> None:
    export = actions.add_parser(
        "export", help="write a Triton model repository (config.pbtxt + version folder)",
        description=(
            "Write a standard Triton model repository. The python variant runs with the embedded "
            "server (onnxruntime on CPU, torch on CUDA for --device gpu); the onnxruntime variant "
            "(platform onnxruntime_onnx) is what a facility's official NVIDIA Triton container "
            "serves.\n\nexample:\n  coffea-sonic models export -o ./repo --backend onnxruntime --device gpu"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_option(export, "model-repository", what="the repository")
    export.add_argument("--backend", choices=("python", "onnxruntime"), default="python",
                        help="python (the embedded server) or onnxruntime (platform "
                             "onnxruntime_onnx, the official container) (default: %(default)s)")
    add_device_option(export, default="cpu",
                      help="where the models run: instance kind, and torch on CUDA for the python "
                           "backend (auto: GPU if nvidia-smi sees one; default: %(default)s)")
    add_list_option(export, "--models", choices=zoo.names() + zoo.pipeline_names(), help="zoo models to export (default: all single models; "
                        f"pipelines when named: {', '.join(zoo.pipeline_names())})")
    export.add_argument("--instances", type=int, default=1, help="instance_group count")
    export.add_argument("--tensorrt", action="store_true",
                        help="onnxruntime on GPU: enable the TensorRT execution accelerator")
    add_json_option(export)
    export.set_defaults(func=run_models_export)


def _add_models_add(actions: argparse._SubParsersAction) -> None:
    add = actions.add_parser(
        "add", help="add an ONNX or TorchScript file to a Triton model repository",
        description=_help(
            "Write DIR/NAME/config.pbtxt and DIR/NAME/VERSION/model.onnx|model.pt the way NVIDIA's "
            "official Triton container expects them; `coffea-sonic serve --repository DIR` serves "
            "the same folder here. The config is checked against the file before anything is "
            "written.",
            "ONNX: inputs, outputs, types and dynamic axes are read from the graph. If every tensor "
            "has a dynamic first axis it is the batch axis (max_batch_size "
            f"{_default_batch()} unless --max-batch-size says otherwise).",
            "TorchScript records no shapes: give --max-batch-size and every --input/--output-tensor "
            "(NAME:TYPE:DIMS, DIMS without the batch axis when --max-batch-size > 0; names are "
            "forward()'s argument names or INPUT__0, OUTPUT__0, ...), or --example-input FILE.npz "
            "(one array per forward argument, batch axis first) to trace them.",
            examples=(
                "coffea-sonic models add tagger.onnx --name tagger -o ./repo "
                "--preferred-batch-size 256 1024",
                "coffea-sonic models add tagger.pt --name tagger_ts -o ./repo "
                "--max-batch-size 1024 \\",
                "    --input INPUT__0:FP32:6 --output-tensor OUTPUT__0:FP32:3 --device gpu --instances 2",
                "coffea-sonic models add pnet.pt --name pnet -o ./repo --max-batch-size 0 \\",
                "    --input points:FP32:-1,2,-1 --input features:FP32:-1,7,-1 "
                "--output-tensor OUTPUT__0:FP32:-1,3",
                "coffea-sonic models add tagger.pt --name tagger_ts -o ./repo "
                "--max-batch-size 512 --example-input x.npz",
                "coffea-sonic models add tagger_v2.onnx --name tagger -o ./repo "
                "--version 2")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add.add_argument("file", metavar="FILE", help="the model: .onnx, or TorchScript (.pt)")
    add.add_argument("--name", required=True, help="model name (its folder and its URL's name)")
    output = add.add_argument("-o", "--output", action=_OutputOrTensor, metavar="DIR",
                              help="the model repository to write into (required)")
    add_deprecated_alias(add, "--repository", output)
    add.add_argument("--max-batch-size", type=int, metavar="N",
                     help="largest batch Triton forms; 0 = the model does not batch (DIMS are full "
                          "shapes); required for TorchScript")
    add_list_option(add, "--preferred-batch-size", type=int, default=[],
                    help="batch sizes the dynamic batcher aims for")
    add.add_argument("--max-queue-delay-us", type=int, metavar="US",
                     help="how long the dynamic batcher may wait to fill a batch")
    add.add_argument("--instances", type=int, default=1, metavar="N",
                     help="model instances (per GPU with --device gpu), default 1")
    add_device_option(add, default="cpu",
                      help="instance_group kind: KIND_CPU or KIND_GPU (auto: GPU if nvidia-smi "
                           "sees one; default: %(default)s)")
    _add_tensor_options(add)
    add.add_argument("--version", type=int, default=1, metavar="N", help="version folder (default 1)")
    add.add_argument("--checksum", action="store_true",
                     help="write a checksum repository agent block (MD5 of the version's files), "
                          "verified before the model loads by the official container and by serve")
    add.add_argument("--response-cache", action="store_true",
                     help="enable Triton's response cache for the model (response_cache { enable: "
                          "true }); the server needs one: serve --response-cache SIZE")
    add.add_argument("--force", action="store_true",
                     help="replace an existing version folder / rewrite a differing config")
    add_json_option(add)
    add.set_defaults(func=run_models_add)


def _add_tensor_options(add: argparse.ArgumentParser) -> None:
    """``models add``'s tensors: what TorchScript does not record."""
    add.add_argument("--input", action="append", default=[], metavar="NAME:TYPE:DIMS",
                     help="an input, e.g. INPUT__0:FP32:6 or points:FP32:-1,2,-1 (repeat per input)")
    add.add_argument("--output-tensor", action="append", default=[], metavar="NAME:TYPE:DIMS",
                     help="an output, e.g. OUTPUT__0:FP32:3 (repeat per output)")
    add.add_argument("--example-input", metavar="FILE.npz",
                     help="TorchScript: arrays to run the module on once, to trace its tensors")


def _add_models_validate(actions: argparse._SubParsersAction) -> None:
    validate = actions.add_parser(
        "validate", help="check a model repository: configs, files, signatures, servability",
        description=_help(
            "Parse every config.pbtxt with Triton's own schema, check the version folders and "
            "model files, compare each declared signature with its model file (ONNX graph; "
            "TorchScript names, and one run on zeros when torch is installed), and say whether "
            "`coffea-sonic serve` can run it. Every problem is listed (model, version, what, "
            "expected vs found); the exit code is 1 if there is any, 0 otherwise.",
            examples=("coffea-sonic models validate ./repo",
                      "coffea-sonic models validate ./repo --official-only   "
                      "# only what the official container needs")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    validate.add_argument("directory", metavar="DIR", help="the model repository")
    validate.add_argument("--official-only", action="store_true",
                          help="leave out whether the embedded server can serve each model")
    add_json_option(validate)
    validate.set_defaults(func=run_models_validate)


def _help(*paragraphs: str, examples: tuple[str, ...] = ()) -> str:
    """Description text: prose paragraphs wrapped to 90 columns, example lines as they are."""
    text = "\n\n".join(textwrap.fill(paragraph, 90) for paragraph in paragraphs)
    return text + ("\n\nexamples:\n" + "\n".join(f"  {line}" for line in examples)
                   if examples else "")


def _default_batch() -> int:
    from .model_files import DEFAULT_MAX_BATCH_SIZE

    return DEFAULT_MAX_BATCH_SIZE


def _served_models(http_address: str) -> list[tuple[str, list[str]]]:
    """(model, ready versions) from the server's repository index."""
    request = urllib.request.Request(f"http://{http_address}/v2/repository/index", data=b"{}",
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            index = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        logger.warning("could not read the repository index: %s", error)
        return []
    versions: dict[str, list[str]] = {}
    for entry in index:
        if entry.get("state") == "READY":
            versions.setdefault(entry["name"], []).append(str(entry.get("version", "")))
    return sorted((name, sorted(v, key=lambda x: int(x) if x.isdigit() else 0))
                  for name, v in versions.items())


def exit_status(returncode: int | None) -> str:
    """A process' return code as a person reads it.

    >>> exit_status(-9), exit_status(1), exit_status(None)
    ('signal SIGKILL (9)', 'exit code 1', 'an unknown status')
    """
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name} ({-returncode})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _gpu_index(text: str) -> int:
    """One GPU index of ``--gpus 0 1`` / ``--gpus 0,1``.

    >>> _gpu_index("2")
    2
    """
    try:
        gpu = int(text)
    except ValueError:
        gpu = -1
    if gpu < 0:
        raise argparse.ArgumentTypeError(f"--gpus takes GPU indices like 0 1 or 0,1, not {text!r}")
    return gpu


def run_serve(args: argparse.Namespace) -> int:
    from .launcher import LocalTritonServer

    if args.skip_unservable and not args.repository:
        print("--skip-unservable applies to --repository DIR (the zoo is always servable)",
              file=sys.stderr)
        return 2
    server = LocalTritonServer(
        models=args.models, repository=args.repository, device=args.device,
        grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
        host=args.host, instances=args.instances, startup_timeout_s=args.startup_timeout_s,
        skip_unservable=args.skip_unservable, gpus=args.gpus, response_cache=args.response_cache,
        torch_ops_libraries=args.torch_ops_library)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started = time.monotonic()
    try:
        server.start()
    except SonicError as error:  # a refusal (nothing started) or a failed start
        print(f"coffea-sonic serve: {error}", file=sys.stderr)
        if args.repository and not isinstance(error, UnservableModelError):
            print(f"\nEvery problem at once: coffea-sonic models validate {args.repository}",
                  file=sys.stderr)
        return 1
    with server:
        print(f"coffea-sonic server ready in {time.monotonic() - started:.1f} s "
              f"(device {server.device}, pid {server.pid})", flush=True)
        print(f"  gRPC     {server.grpc_address}", flush=True)
        print(f"  HTTP     {server.http_address}", flush=True)
        print(f"  metrics  {server.metrics_url}", flush=True)
        if server.response_cache is not None:
            print(f"  response cache  {server.response_cache / 1e6:.0f} MB", flush=True)
        if args.repository:
            for name, versions in _served_models(server.http_address):
                print(f"  model    {server.url(name)}  (versions {', '.join(versions)})", flush=True)
        else:
            for name in args.models or zoo.names():
                print(f"  model    {server.url(name)}", flush=True)
        for model, version, reason in getattr(server, "skipped", None) or []:
            where = f"{model} version {version}" if version is not None else model
            print(f"  skipped  {where}: {reason}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                print(f"coffea-sonic serve: tritonserver (pid {server.pid}) exited unexpectedly "
                      f"with {exit_status(server.process.returncode)}; its log's last lines:\n"
                      f"{server.log_tail()}", file=sys.stderr, flush=True)
                return 1
    print("server stopped", flush=True)
    return 0


def run_models_list(args: argparse.Namespace) -> int:
    document = _models_document()
    if getattr(args, "json", False):
        print_json(document)
        return 0
    for entry in document:
        print(f"{entry['name']}: {entry['description']}")
        for kind, key in (("in ", "inputs"), ("out", "outputs")):
            for tensor in entry[key]:
                print(f"    {kind} {tensor['name']:12s} {tensor['dtype']} {tensor['dims']}")
        print(f"    max_batch_size {entry['max_batch_size']}" if entry["kind"] == "model" else
              "    ragged: hits__counts gives each event's hits; one label per hit")
    return 0


def _models_document() -> list[dict]:
    """``models list --json``: one object per zoo model and pipeline."""
    document: list[dict] = []
    for name in zoo.names():
        model_spec = zoo.spec(name)
        document.append({
            "name": name, "kind": "model", "description": model_spec.description,
            "max_batch_size": model_spec.max_batch_size,
            **{kind: [{"name": t.name, "dtype": str(t.dtype), "dims": list(t.dims)}
                      for t in tensors]
               for kind, tensors in (("inputs", model_spec.inputs), ("outputs", model_spec.outputs))}})
    for name, description in zoo.pipelines().items():
        document.append({
            "name": name, "kind": "pipeline", "description": description, "max_batch_size": 0,
            "inputs": [{"name": "hits", "dtype": "float32", "dims": [-1, 3]},
                       {"name": "hits__counts", "dtype": "int64", "dims": [-1]}],
            "outputs": [{"name": "labels", "dtype": "int64", "dims": [-1]}]})
    return document


def run_models_export(args: argparse.Namespace) -> int:
    from .pipelines import write_models

    device = resolve_device(args.device)
    path = write_models(args.output, args.models, backend=args.backend, device=device,
                        instances=args.instances, tensorrt=args.tensorrt)
    if getattr(args, "json", False):
        print_json({"repository": str(path), "backend": args.backend, "device": device,
                    "models": sorted(entry.name for entry in path.iterdir() if entry.is_dir())})
        return 0
    print(f"wrote Triton model repository {path} ({args.backend} backend, {device})")
    return 0


def run_models_add(args: argparse.Namespace) -> int:
    from .model_files import add_model, parse_tensor_spec

    if not args.output:
        print("coffea-sonic models add: say which repository to write into: -o/--output DIR",
              file=sys.stderr)
        return 2
    try:
        added = add_model(
            args.file, args.name, args.output, max_batch_size=args.max_batch_size,
            preferred_batch_sizes=args.preferred_batch_size,
            max_queue_delay_us=args.max_queue_delay_us, instances=args.instances,
            device=resolve_device(args.device), inputs=[parse_tensor_spec(t) for t in args.input],
            outputs=[parse_tensor_spec(t) for t in args.output_tensor], version=args.version,
            example_input=args.example_input, force=args.force, checksum=args.checksum,
            response_cache=args.response_cache)
    except SonicError as error:
        print(f"coffea-sonic models add: {error}", file=sys.stderr)
        return 1
    config = added.config
    if getattr(args, "json", False):
        print_json({"name": added.name, "version": added.version,
                    "model_path": str(added.model_path), "config_path": str(added.config_path),
                    "platform": config.platform or config.backend,
                    "max_batch_size": config.max_batch_size, "notes": list(added.notes)})
        return 0
    print(f"added {added.name} version {added.version}: {added.model_path}")
    print(f"  config   {added.config_path}  ({config.platform or config.backend}, max_batch_size "
          f"{config.max_batch_size}, {config.instance_group[0].count} x "
          f"{'GPU' if config.instance_group[0].kind == config.instance_group[0].KIND_GPU else 'CPU'})")
    for kind, tensors in (("input ", config.input), ("output", config.output)):
        for tensor in tensors:
            print(f"  {kind}   {tensor.name} {_type_name(tensor.data_type)} {list(tensor.dims)}")
    for note in added.notes:
        print(f"  note     {note}")
    print(f"next: coffea-sonic models validate {args.output}\n"
          f"      coffea-sonic serve --repository {args.output}")
    return 0


class _OutputOrTensor(argparse.Action):
    """``models add -o/--output DIR``; a value shaped NAME:TYPE:DIMS is the old ``--output`` of an
    output tensor (now ``--output-tensor``): it still lands there, with a deprecation warning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        if option_string == "--output" and _TENSOR_SPEC.fullmatch(str(values)):
            warn_deprecated(parser, "--output NAME:TYPE:DIMS", "--output-tensor")
            namespace.output_tensor = [*(getattr(namespace, "output_tensor", None) or []), values]
            return
        setattr(namespace, self.dest, values)


_TENSOR_SPEC = re.compile(r"[^/\\:\s]+:[A-Za-z]+[0-9]*:-?[0-9]+(,-?[0-9]+)*")


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")


def run_models_validate(args: argparse.Namespace) -> int:
    from .model_check import validate_repository

    report = validate_repository(args.directory, embedded=not args.official_only)
    if getattr(args, "json", False):
        print_json({"repository": report.repository, "ok": report.ok, "models": report.models,
                    "problems": report.problems, "notes": report.notes})
        return 0 if report.ok else 1
    by_model: dict[str, list] = {}
    for problem in report.problems:
        by_model.setdefault(problem.model, []).append(problem)
    for model in report.models:
        print(f"{model}: {'ok' if model not in by_model else f'{len(by_model[model])} problem(s)'}")
    for model in sorted(set(by_model) - set(report.models)):
        print(f"{model}:")
    for problem in report.problems:
        print(f"  {problem.describe()}")
    for note in report.notes:
        print(f"  note: {note}")
    print(f"{len(report.models)} model(s) in {report.repository}, {len(report.problems)} problem(s)")
    return 0 if report.ok else 1
