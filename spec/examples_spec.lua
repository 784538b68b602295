-- Runs the example scripts at tiny sizes, in fresh interpreters.
local H = require "helpers"

local function run_example(name, args, env)
  local code = ([[
    arg = { [0] = "examples/%s.lua", %s }
    STA_NO_PROGRESS = true
    dofile("examples/%s.lua")
  ]]):format(name, args, name)
  env = env or {}
  env.STA_NO_PROGRESS = "1"
  return H.run_lua(code, env)
end

local function quoted(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = ("%q"):format(a) end
  return table.concat(out, ", ")
end

describe("examples", function()
  after_each(H.cleanup)

  it("pipeline.lua runs a small CFG denoising loop", function()
    local out, ok = run_example("pipeline", quoted{ "--steps", "3", "--layers", "2", "--heads", "2", "--head-dim", "16",
      "--canvas", "4x8x8", "--tile", "2x4x4", "--text", "4", "--full-steps", "1", "--device", "cpu" },
      { STA_ATTENTION_CONFIG = false })
    assert.is_true(ok, out)
    assert.truthy(out:find("step  1/3  window 2x2x2", 1, true), out)
    assert.truthy(out:find("step  3/3  window 1x1x1", 1, true), out)
    assert.truthy(out:find("3 steps x 2 passes x 2 layers = 12 STA forwards", 1, true), out)
    assert.truthy(out:find("median layer forward %d+%.%d+ ms %(by layer: [%d%.]+ / [%d%.]+%)\n"), out)
    assert.falsy(out:find("last kernel", 1, true), out) -- the CPU launches none
    assert.truthy(out:find("contexts left 0", 1, true))
    assert.truthy(out:find("all finite", 1, true))
    assert.truthy(out:match("\nok\n$"), out)
  end)

  it("pipeline.lua runs VSA layers with the batch's sparsity after the dense steps (--mode vsa)", function()
    local out, ok = run_example("pipeline", quoted{ "--mode", "vsa", "--sparsity", "0.875", "--steps", "3",
      "--layers", "2", "--heads", "2", "--head-dim", "16", "--canvas", "5x8x12", "--full-steps", "1",
      "--device", "cpu" }, { STA_ATTENTION_CONFIG = false })
    assert.is_true(ok, out)
    -- 2x2x3 = 12 cubes; ceil(0.125 * 12) = 2
    assert.truthy(out:find("attention: VSA, cube 4x4x4, 12 cubes, sparsity 0.875 (every cube for 1 steps)",
      1, true), out)
    assert.truthy(out:find("step  1/3  topk 12/12 cubes", 1, true), out)
    assert.truthy(out:find("step  3/3  topk 2/12 cubes", 1, true), out)
    assert.truthy(out:find("3 steps x 2 passes x 2 layers = 12 VSA forwards", 1, true), out)
    assert.truthy(out:find("all finite", 1, true), out)
    assert.truthy(out:match("\nok\n$"), out)
    local help = run_example("pipeline", quoted{ "--help" })
    for _, o in ipairs{ "--mode sta|vsa", "--sparsity S", "--cube TxHxW" } do
      assert.truthy(help:find(o, 1, true), help)
    end
    out, ok = run_example("pipeline", quoted{ "--mode", "vsa", "--sparsity", "1" })
    assert.is_false(ok)
    assert.truthy(out:find("pipeline: --sparsity: expected a number in [0, 1), got 1", 1, true), out)
  end)

  it("finetune.lua fits a VSA layer and its gate to dense attention (--mode vsa)", function()
    local out, ok = run_example("finetune", quoted{ "--mode", "vsa", "--steps", "6", "--heads", "2",
      "--head-dim", "16", "--canvas", "8x8x12", "--sparsity", "0.75", "--device", "cpu" })
    assert.is_true(ok, out)
    assert.truthy(out:find("student VSA, cube 4x4x4, top 3 of 12 cubes (sparsity 0.75), gate from 0", 1, true),
      out)
    local losses = {}
    for l in out:gmatch("step +%d+  loss ([%d%.e%-+]+)") do losses[#losses + 1] = tonumber(l) end
    assert.equal(7, #losses, out)
    assert.is_true(losses[7] < 0.7 * losses[1], out)
    assert.truthy(out:match("\nok\n$"), out)
    local help = run_example("finetune", quoted{ "--help" })
    assert.truthy(help:find("--mode sta|vsa", 1, true), help)
  end)

  it("bench/bench_layer.lua times the layer path against the bare forward (CPU, small)", function()
    local out, ok = H.run_lua([[
      arg = { [0] = "bench/bench_layer.lua", "--device", "cpu", "--canvas", "6x8x16", "--text", "5",
        "--heads", "2", "--head-dim", "16", "--window", "1x1x3", "--reps", "2", "--rounds", "1",
        "--seed", "]] .. H.seed() .. [[" }
      dofile("bench/bench_layer.lua")
    ]])
    assert.is_true(ok, out)
    assert.truthy(out:find("layer x,x,x against bare x,x,x: max |diff| 0 (identical)", 1, true), out)
    local rows = 0
    for name, ms in out:gmatch("\n| ([%w ,']+) | [%d%.]+ | ([%d%.]+) |") do
      rows = rows + 1
      assert.is_true(tonumber(ms) > 0, name)
    end
    assert.equal(8, rows, out)
    assert.truthy(out:match("\nok\n$"), out)
  end)

  it("finetune.lua fits a sparse layer to dense attention through the backward", function()
    local out, ok = run_example("finetune", quoted{ "--steps", "6", "--heads", "2", "--head-dim", "16",
      "--canvas", "6x8x16", "--tile", "3x4x4", "--text", "5", "--window", "1x1x1", "--device", "cpu" })
    assert.is_true(ok, out)
    local losses = {}
    for l in out:gmatch("step +%d+  loss ([%d%.e%-+]+)") do losses[#losses + 1] = tonumber(l) end
    assert.equal(7, #losses, out)
    assert.is_true(losses[7] < 0.5 * losses[1], out)
    assert.truthy(out:match("\nok\n$"), out)
    out, ok = run_example("finetune", quoted{ "--steps", "0" })
    assert.is_false(ok)
    assert.truthy(out:find("finetune: --steps: expected >= 1, got 0", 1, true), out)
  end)

  it("pipeline.lua takes the strategy from STA_ATTENTION_CONFIG", function()
    local sta = require "sta"
    local p = H.tmp(".json")
    local s = sta.strategy.uniform{ steps = 2, layers = 1, heads = 2, window = {1, 1, 1} }
    s:set(1, 0, 1, {2, 2, 2})
    s:save(p)
    local args = quoted{ "--steps", "2", "--layers", "1", "--heads", "2", "--head-dim", "8", "--canvas", "4x8x8",
      "--tile", "2x4x4", "--text", "0", "--device", "cpu" }
    local out, ok = run_example("pipeline", args, { STA_ATTENTION_CONFIG = p })
    assert.is_true(ok, out)
    assert.truthy(out:find("strategy: " .. p, 1, true), out)
    -- a strategy that lacks a step fails naming the key
    out, ok = run_example("pipeline", quoted{ "--steps", "3", "--layers", "1", "--heads", "2", "--head-dim", "8",
      "--canvas", "4x8x8", "--tile", "2x4x4", "--text", "0" }, { STA_ATTENTION_CONFIG = p })
    assert.is_false(ok)
    assert.truthy(out:find('mask strategy has no window for "2_0_0"', 1, true), out)
  end)

  it("pipeline.lua rejects unknown options", function()
    local out, ok = run_example("pipeline", quoted{ "--stepz", "3" })
    assert.is_false(ok)
    assert.truthy(out:find("--stepz: unknown option", 1, true), out)
  end)

  it("mask_search.lua finds the known answer and writes strategy and pictures", function()
    local dir = H.tmp("")
    local out, ok = run_example("mask_search", quoted{ "--prompts", "2", "--steps", "2", "--layers", "1",
      "--heads", "6", "--head-dim", "16", "--canvas", "3x6x6", "--tile", "1x2x2", "--out", dir })
    assert.is_true(ok, out)
    assert.truthy(out:find("ok: local heads chose 1x1x1, wide heads 1x3x3", 1, true), out)
    local sta = require "sta"
    local s = assert(sta.strategy.load(dir .. "/strategy.json"))
    assert.same({3, 3, 3}, s:get(0, 0, 0))
    assert.same({1, 1, 1}, s:get(1, 0, 0))
    assert.same({1, 3, 3}, s:get(1, 0, 5))
    for _, f in ipairs{ "strategy.svg", "tiles_head0.svg", "tiles_head5.svg", "search_1.json", "search_2.json" } do
      assert.truthy(H.read(dir .. "/" .. f):find("%S"))
      os.remove(dir .. "/" .. f)
    end
    os.remove(dir .. "/strategy.json")
    os.remove(dir)
  end)

  it("mask_search.lua without --out writes into a new folder under $TMPDIR, not the checkout", function()
    local tmpdir = H.tmp(".tmpdir")
    assert.is_true(os.execute("mkdir " .. H.quote(tmpdir)))
    local out, ok = run_example("mask_search", quoted{ "--prompts", "1", "--steps", "1", "--layers", "1",
      "--heads", "6", "--head-dim", "8", "--canvas", "3x6x6", "--tile", "1x2x2", "--skip-steps", "0" },
      { TMPDIR = tmpdir })
    assert.is_true(ok, out)
    local dir = out:match("tuned strategy: (" .. tmpdir:gsub("%p", "%%%0") .. "/sta%-mask_search%.%w+)/strategy%.json")
    assert.truthy(dir, out)
    assert.truthy(H.read(dir .. "/strategy.json"):find("%S"))
    local f = io.open("mask_search_out")
    if f then f:close() end
    assert.is_nil(f, "mask_search_out/ in the working folder")
    assert.is_true(os.execute("rm -rf " .. H.quote(tmpdir)))
  end)

  it("every example's --help describes it and gives each option's default", function()
    local names = {}
    for f in io.popen("ls examples"):lines() do names[#names + 1] = f end
    assert.is_true(#names >= 6, table.concat(names, " "))
    for _, f in ipairs(names) do
      local cmd
      if f:match("%.lua$") then
        cmd = ("LUA_PATH=%s LUA_CPATH=%s lua5.4 examples/%s --help"):format(H.quote(package.path),
          H.quote(package.cpath), f)
      elseif f:match("%.py$") then
        local py
        for _, p in ipairs{ "python3", "/usr/bin/python3" } do
          if not py and select(2, H.sh(p .. " -c 'import torch'")) then py = p end
        end
        if not py then goto continue end -- the Python examples need torch
        cmd = py .. " examples/" .. f .. " --help"
      else goto continue end
      do
        local out, ok = H.sh(cmd)
        assert.is_true(ok, f .. ": " .. out)
        assert.equal(1, out:find("usage: " .. f, 1, true), f .. ": " .. out)
        local about, opts = out:match("\n\n(.-)\n\noptions:\n(.*)$")
        assert.truthy(about, f .. ": " .. out)
        assert.is_true(#about > 200, f .. ": a description of what it does: " .. about)
        local n = 0
        for line in opts:gmatch("[^\n]+") do
          local opt = line:match("^  (%-%-[%w%-]+)")
          if opt then
            n = n + 1
            -- the default on the option's own line, or on the next (a long option)
            local rest = opts:match(opt:gsub("%p", "%%%0") .. "[^\n]*\n?[^\n]*")
            assert.truthy(rest:find("default", 1, true), f .. " " .. opt .. ": no default in: " .. rest)
          end
        end
        assert.is_true(n >= 4, f .. ": " .. opts)
      end
      ::continue::
    end
  end)

  it("compare.lua prints the per-head table for .npy and .safetensors inputs", function()
    local sta = require "sta"
    local S = 2 * 8 * 8 + 3
    local q, k, v = H.randn({1, S, 2, 16}), H.randn({1, S, 2, 16}), H.randn({1, S, 2, 16})
    local pq, pk, pv = H.tmp(".npy"), H.tmp(".npy"), H.tmp(".npy")
    q:save(pq); k:save(pk); v:save(pv)
    local common = { "--canvas", "2x8x8", "--tile", "1x4x4", "--text", "3", "--window", "1x1x1,2x2x2" }
    local args = { "--q", pq, "--k", pk, "--v", pv }
    for _, a in ipairs(common) do args[#args + 1] = a end
    local out, ok = run_example("compare", quoted(args))
    assert.is_true(ok, out)
    assert.truthy(out:find("   0   1x1x1", 1, true), out)
    -- head 1 runs the full window: zero error
    assert.truthy(out:find("   1   2x2x2      0.0%%%s+0%.000e%+00%s+0%.000e%+00%s+0%.0000"), out)
    local st = H.tmp(".safetensors")
    sta.save_safetensors(st, { query = q, key = k, value = v })
    args = { "--file", st, "--names", "query,key,value" }
    for _, a in ipairs(common) do args[#args + 1] = a end
    local out2, ok2 = run_example("compare", quoted(args))
    assert.is_true(ok2, out2)
    assert.equal(out:match("head.-\nall heads: relative L2 error [%d.]+"), out2:match("head.-\nall heads: relative L2 error [%d.]+"))
    local out3, ok3 = run_example("compare", quoted{ "--q", "/nonexistent.npy", "--k", pk, "--v", pv })
    assert.is_false(ok3)
    assert.truthy(out3:find("compare: /nonexistent.npy: cannot open", 1, true), out3)
  end)

  it("sta-repl starts with a banner, evaluates, keeps history", function()
    local so = package.searchpath("sta.core", package.cpath)
    local build = so:match("^(.*)/lua/sta/core%.so$")
    local hist = H.tmp(".history")
    local out, ok = H.sh(("printf 'x = sta.randn({5}, {seed = 3})\\nprint(#x, x:dtype())\\n' | BUILD=%s STA_HISTORY=%s scripts/sta-repl")
      :format(H.quote(build), H.quote(hist)))
    assert.is_true(ok, out)
    assert.truthy(out:find("sta 0.1.0 -- Sliding Tile Attention", 1, true), out)
    assert.truthy(out:find("5\tf32", 1, true), out)
    assert.truthy(H.read(hist):find("print(#x, x:dtype())", 1, true))
  end)
end)

-- bad arguments end in a message and a status, never a traceback
describe("examples' argument checks", function()
  local function run(cmd)
    local f = assert(io.popen(("LUA_PATH=%s LUA_CPATH=%s %s 2>&1"):format(H.quote(package.path),
      H.quote(package.cpath), cmd)))
    local out = f:read("a")
    local _, _, code = f:close()
    return out, code
  end

  it("pipeline.lua and sp_pipeline.lua refuse bad options with a status", function()
    local sta = require "sta"
    local cases = {
      { "examples/pipeline.lua --steps 0", 2, "pipeline: --steps: expected an integer >= 1, got 0\nusage:" },
      { "examples/pipeline.lua --steps 3 --full-steps 20", 2, "pipeline: --full-steps 20: more than --steps 3\n" },
      { "examples/pipeline.lua --heads 2.5", 2, "pipeline: --heads: expected an integer, got 2.5\n" },
      { "examples/pipeline.lua --device tpu", 2, "pipeline: --device: expected auto, cpu or cuda, got 'tpu'\n" },
      { "examples/sp_pipeline.lua --ranks 3", 2, "sp_pipeline: --ranks 3: the small shape's 8 heads and 1536 "
        .. "video tokens must divide among the ranks (try 1, 2, 4 or 8)\nusage:" },
      { "examples/sp_pipeline.lua --shape big", 2, "sp_pipeline: --shape: expected small, medium or hunyuan, got 'big'\n" },
      { "examples/mask_search.lua --steps 0", 2, "mask_search: --steps: expected an integer >= 1, got 0\n" },
    }
    if not sta.backend_available("cuda") then
      cases[#cases + 1] = { "examples/pipeline.lua --device cuda", 1, "pipeline: --device cuda: no CUDA device here (" }
      cases[#cases + 1] = { "examples/sp_pipeline.lua --device cuda", 1, "sp_pipeline: --device cuda: no CUDA device here (" }
    end
    for _, c in ipairs(cases) do
      local out, code = run("lua5.4 " .. c[1])
      assert.equal(c[2], code, c[1] .. ": " .. out)
      assert.equal(1, out:find(c[3], 1, true), c[1] .. ": " .. out)
      assert.falsy(out:find("traceback", 1, true), out)
    end
  end)

  it("sta-launch on a machine without GPUs says it uses TCP, and runs", function()
    local _, gpu = H.sh("nvidia-smi -L 2>/dev/null | grep -q '^GPU'")
    if gpu then return end -- NCCL is the default there
    local out, code = run("env -u STA_DIST_BACKEND scripts/sta-launch -n 2 examples/sp_pipeline.lua --seed 5")
    assert.equal(0, code, out)
    assert.truthy(out:find("sta-launch: no CUDA device found; the ranks join over TCP on 127.0.0.1 "
      .. "(STA_DIST_BACKEND=tcp)", 1, true), out)
    assert.truthy(out:find("[1] sp small P=2 rank 1 cpu f32: max|diff| 0 rel 0 ok (bitwise)", 1, true), out)
  end)
end)
