-- sta_run_spec.lua -- sta-run --mode vsa (STA.md section 12) end to end:
-- files written here, the output and lse equal to sta.vsa's (through the
-- cube order and back) bit for bit, --order cubes, --topk, --cube 4,8,8,
-- the gate file, the reference, and every refusal with its option and
-- status 2.
local sta = require "sta"
local H = require "helpers"

local build = os.getenv("STA_BUILD") or os.getenv("BUILD") or "build"
-- without the sanitizer run's preloaded ASan runtime (make sanitize: an
-- instrumented sta-run carries its own)
local exe = "env -u LD_PRELOAD " .. (build:sub(1, 1) == "/" and build .. "/sta-run"
  or "./" .. build .. "/sta-run")

local function run(args)
  local out, ok = H.sh(exe .. " " .. args)
  return out, ok
end

local function file(t)
  local p = H.tmp(".npy")
  assert(t:save(p))
  return p
end

-- lse [B, heads, S] as the 4-D tensor the cube helpers take
local function lse4(t) local s = t:shape() return t:view({ s[1], s[2], s[3], 1 }) end

describe("sta-run --mode vsa", function()
  after_each(H.cleanup)
  local canvas, S = { 5, 6, 7 }, 5 * 6 * 7

  it("equals sta.vsa through the cube order, output and lse bit for bit", function()
    local q, k, v, g = H.randn({ 1, S, 2, 16 }), H.randn({ 1, S, 2, 16 }), H.randn({ 1, S, 2, 16 }),
                       H.randn({ 1, S, 2, 16 })
    local fq, fk, fv, fg = file(q), file(k), file(v), file(g)
    local fo, fl = H.tmp(".npy"), H.tmp(".npy")
    local out, ok = run(("--q %s --k %s --v %s --out %s --lse %s --mode vsa --canvas 5,6,7 "
      .. "--sparsity 0.6 --gate %s"):format(fq, fk, fv, fo, fl, fg))
    assert.is_true(ok, out)
    assert.truthy(out:find("vsa canvas 5x6x7 cube 4x4x4, top 4 of 8 cubes, gate, cpu f32", 1, true), out)
    local function c(t) return sta.to_cubes(t, { canvas = canvas }) end
    local want, wl = sta.vsa(c(q), c(k), c(v), { canvas = canvas, sparsity = 0.6, gate = c(g), lse = true })
    assert.is_true(H.same_values(sta.load(fo), sta.from_cubes(want, { canvas = canvas })))
    local got_lse = sta.load(fl)
    assert.same({ 1, 2, S }, got_lse:shape())
    assert.is_true(H.same_values(lse4(got_lse), sta.from_cubes(lse4(wl), { canvas = canvas, layout = "bhsd" })))
    -- the rows in cube order already, 4x8x8 cubes, topk
    local qc, kc, vc = c(q), c(k), c(v)
    local qc8 = sta.to_cubes(q, { canvas = canvas, cube = { 4, 8, 8 } })
    fq, fk, fv = file(qc8), file(sta.to_cubes(k, { canvas = canvas, cube = "4x8x8" })),
      file(sta.to_cubes(v, { canvas = canvas, cube = "4x8x8" }))
    out, ok = run(("--q %s --k %s --v %s --out %s --mode vsa --canvas 5,6,7 --cube 4,8,8 --topk 1 "
      .. "--order cubes"):format(fq, fk, fv, fo))
    assert.is_true(ok, out)
    assert.truthy(out:find("bshd cubes, vsa canvas 5x6x7 cube 4x8x8, top 1 of 2 cubes", 1, true), out)
    local w8 = sta.vsa(qc8, sta.load(fk), sta.load(fv), { canvas = canvas, cube = "4x8x8", topk = 1 })
    assert.is_true(H.same_values(sta.load(fo), w8))
    -- the reference agrees
    fq, fk, fv = file(qc), file(kc), file(vc)
    out, ok = run(("--q %s --k %s --v %s --out %s --mode vsa --canvas 5,6,7 --topk 3 --order cubes "
      .. "--reference --quiet"):format(fq, fk, fv, fo))
    assert.is_true(ok, out)
    assert.equal("", out)
    local _, rel = sta.load(fo):compare(sta.vsa(qc, kc, vc, { canvas = canvas, topk = 3 }))
    assert.is_true(rel < 1e-5, rel)
  end)

  it("refuses options VSA does not take, naming them, with status 2", function()
    local q = file(H.randn({ 1, S, 2, 8 }))
    local base = ("--q %s --k %s --v %s --out %s "):format(q, q, q, H.tmp(".npy"))
    for _, c in ipairs{
      { "--mode vsa --sparsity 0.5", "sta-run: --canvas: is required with --mode vsa" },
      { "--mode vsa --canvas 5,6,7", "sta-run: --sparsity: or --topk: give one with --mode vsa" },
      { "--mode vsa --canvas 5,6,7 --sparsity 0.5 --topk 2",
        "sta-run: --sparsity: or --topk: give one with --mode vsa" },
      { "--mode vsa --canvas 5,6,7 --sparsity 1", "sta-run: --sparsity '1': expected a number in [0, 1)" },
      { "--mode vsa --canvas 5,6,7 --topk 0", "sta-run: --topk '0': expected an integer >= 1" },
      { "--mode vsa --canvas 5,6,7 --sparsity 0.5 --window 3,3,3",
        "sta-run: --window: is STA's, not taken with --mode vsa" },
      { "--mode vsa --canvas 5,6,7 --sparsity 0.5 --text-len 0",
        "sta-run: --text-len: is STA's, not taken with --mode vsa" },
      { "--mode vsa --canvas 5,6,7 --sparsity 0.5 --precision fp8",
        "sta-run: --precision: is STA's, not taken with --mode vsa" },
      { "--mode vsb", "sta-run: --mode 'vsb': expected sta or vsa" },
      { "--window 3,3,3 --sparsity 0.5", "sta-run: --sparsity: needs --mode vsa" },
      { "--window 3,3,3 --order cubes", "sta-run: --order cubes: needs --mode vsa" },
      { "--mode vsa --canvas 5,6,7 --cube 4,4 --topk 1",
        "sta-run: --cube '4,4': expected CT,CH,CW or CTxCHxCW, three integers >= 1" },
      { "--window 3,3,3 --dtype i32", "sta-run: --dtype 'i32': expected f32, f16 or bf16" },
    } do
      local out, ok, _, code = H.sh(exe .. " " .. base .. c[1])
      assert.is_false(ok, c[1])
      assert.equal(1, out:find(c[2], 1, true), c[1] .. ": " .. out)
      local _ = code
    end
    -- a canvas that is not q's rows: the core's message, status 1
    local out, ok = run(base .. "--mode vsa --canvas 5,6,8 --sparsity 0.5")
    assert.is_false(ok)
    assert.truthy(out:find("^sta%-run: "), out)
  end)
end)
