"""`attnlab generate --model DIR --prompt TEXT`: continue a prompt with a GPT trained by
`attnlab train` (its last line prints this command with the run's directory)."""

from __future__ import annotations

from attnlab.cli.options import add_alias, add_threads, command


def add_parser(sub):
    p = command(sub, "generate", __doc__, "generate text from a trained checkpoint")
    which = p.add_mutually_exclusive_group(required=True)
    model = which.add_argument("--model", metavar="DIR", default=None,
                               help="the checkpoint directory attnlab train wrote (required; no "
                               "default; attnlab train's last line names it)")
    add_alias(which, "--checkpoint", model)
    p.add_argument("--prompt", required=True, metavar="TEXT", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="how many characters to add at most")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="sampling temperature; 0 = always the most likely token")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample among the K most likely tokens only (default: all)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="the same seed gives the same text")
    add_threads(p)
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.models import generate, load_checkpoint

    if args.model is None:
        raise AttnlabError("--model: required: the checkpoint directory attnlab train wrote")
    model, tok = load_checkpoint(args.model)
    ids = generate(model, _encode(tok, args.prompt), args.max_new_tokens,
                   temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(tok.decode(ids))
    return 0


def _encode(tok, prompt):
    from attnlab.errors import AttnlabError

    try:
        return tok.encode(prompt)
    except AttnlabError as e:
        raise AttnlabError(f"--prompt: {e}") from None
