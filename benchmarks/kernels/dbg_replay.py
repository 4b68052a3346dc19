import os, torch, traceback
import dsv4sel.kernels.flashmla_replay as R
from bench_flashmla_plan_run import BLOCK, TOPK, WINDOW, make_layer
from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl
for batch, heads in ((4, 64), (4, 16)):
    gen = torch.Generator().manual_seed(1)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", BLOCK)
    layers = [make_layer(impl, batch, heads, gen, "cuda") for _ in range(2)]
    tl_ = torch.full((batch,), WINDOW, dtype=torch.int32, device="cuda")
    etl = torch.randint(256, TOPK + 1, (batch,), generator=gen, dtype=torch.int32).to("cuda")
    mk = lambda: impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=512**-0.5, topk_length=tl_, extra_topk_length=etl)
    os.environ[R.REPLAY_ENV] = "off"; direct = mk(); del os.environ[R.REPLAY_ENV]
    plan = mk(); rep = plan.state["replay"]
    print(batch, heads, "usable", rep.usable, rep.why_not)
    for i in range(3):
        a = impl.run(**layers[i % 2], plan=plan); b = impl.run(**layers[i % 2], plan=direct)
        torch.cuda.synchronize()
        print(" call", i, "replays", rep.replays, "graphs", len(rep.graphs), "why", rep.why_not,
              "out eq", torch.equal(a.out, b.out), (a.out.float() - b.out.float()).abs().max().item(),
              "lse eq", torch.equal(a.lse, b.lse), (a.lse - b.lse).abs().max().item(), a.out.shape, b.out.shape, a.lse.shape, b.lse.shape)
    st = plan.state
    print(" idx staged eq", torch.equal(rep.idx, layers[0]["indices"]) or torch.equal(rep.idx, layers[1]["indices"]),
          "eidx", torch.equal(rep.eidx, layers[0]["extra_indices"]) or torch.equal(rep.eidx, layers[1]["extra_indices"]),
          "q", torch.equal(rep.q_stage[:, :, :heads], layers[0]["q"]) or torch.equal(rep.q_stage[:, :, :heads], layers[1]["q"]))
    if rep.graphs:
        e = next(iter(rep.graphs.values()))
        print(" graph out eq direct", torch.equal(rep.out[:, :, :heads], b.out), "lse shape", e[2].shape, e[2].stride())
