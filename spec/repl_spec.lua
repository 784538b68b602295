-- The REPL (scripts/sta-repl, lua/sta/repl.lua) and its reference card
-- (sta.help): signatures for every function, tables printed readably, a
-- banner without "cuda: cuda:", and no history written unless asked.
local H = require "helpers"
local sta = require "sta"
local help = require "sta.help"

local function build_dir()
  local so = package.searchpath("sta.core", package.cpath)
  return so:match("^(.*)/lua/sta/core%.so$")
end

--- Pipe lines into scripts/sta-repl with env (a shell prefix); returns output, ok.
local function repl(lines, env)
  local input = H.tmp(".lua")
  H.write(input, table.concat(lines, "\n") .. "\n")
  return H.sh(("%s BUILD=%s scripts/sta-repl < %s"):format(env or "", H.quote(build_dir()), H.quote(input)))
end

describe("sta.help", function()
  after_each(H.cleanup)

  it("has a signature for every function of sta, sta.strategy and sta.metadata", function()
    local have = {}
    for _, e in ipairs(help.entries) do have[e[2]] = e end
    local missing = {}
    local function scan(t, prefix)
      for k, v in pairs(t) do
        if type(v) == "function" and type(k) == "string" and not k:match("^_") then
          local name = prefix .. k
          local e = have[name]
          if not e then missing[#missing + 1] = name
          else
            -- the signature names the function as it is called
            assert.truthy(e[3]:find("sta." .. name, 1, true) or e[3]:find("sta." .. name .. "{", 1, true),
              name .. ": " .. e[3])
          end
        end
      end
    end
    scan(sta, "")
    scan(sta.strategy, "strategy.")
    scan(sta.metadata, "metadata.")
    table.sort(missing)
    assert.same({}, missing) -- each needs a line in lua/sta/help.lua
    -- and every entry is a function that exists (no stale lines)
    for _, e in ipairs(help.entries) do
      local ns, name = e[2]:match("^(%w+)%.(.+)$")
      local v = ns and sta[ns][name] or sta[e[2]]
      assert.truthy(v ~= nil, "help lists sta." .. e[2] .. ", which is gone")
    end
  end)

  it("names every tensor method", function()
    local class = debug.getregistry()["sta.Tensor"]
    for name in pairs(class.methods) do
      assert.truthy(help.tensor_methods:find("%f[%w_]" .. name .. "%f[^%w_]"), "tensor method " .. name)
    end
  end)

  it("finds one entry by function or by part of its name", function()
    assert.equal(1, help.text(sta.attention_backward):find("sta.attention_backward(q, k, v, out, lse, dout", 1, true))
    local t = help.text("strategy")
    assert.truthy(t:find("sta.strategy.uniform{steps=", 1, true), t)
    assert.falsy(t:find("sta.randn", 1, true), t)
    assert.truthy(help.text("no_such_thing"):find('no entry has "no_such_thing"', 1, true))
    assert.truthy(help.text(print):find("not one of sta's", 1, true))
    local all = help.text()
    assert.truthy(all:find("-- tensors\n", 1, true) and all:find("-- tensor methods\n", 1, true), all)
  end)

  it("formats tables readably: sorted keys, lists, nesting, values with __tostring", function()
    local x = H.randn({ 2 })
    assert.equal('{[3] = true, a = 1, b = "s", list = {1, 2.5, "x"}, ["two words"] = false}',
      help.format({ b = "s", a = 1, list = { 1, 2.5, "x" }, [3] = true, ["two words"] = false }))
    assert.equal("{1, 2, 3}", help.format({ 1, 2, 3 }))
    assert.equal("{}", help.format({}))
    assert.equal(("{t = %s}"):format(tostring(x)), help.format({ t = x }))
    assert.equal("plain", help.format("plain"))
    local long = {}
    for i = 1, 40 do long[i] = i end
    assert.truthy(help.format(long):find(", 16, ... (40 items)}", 1, true))
    local info = help.format(sta.info())
    assert.truthy(info:find(('\n  version = "%s"'):format(sta.info().version), 1, true), info)
    assert.truthy(info:find("backends = {", 1, true), info)
    assert.falsy(info:find("table: 0x", 1, true), info)
  end)
end)

describe("sta-repl", function()
  after_each(H.cleanup)

  it("prints tables readably, help() with signatures, a banner without 'cuda: cuda:'", function()
    local out, ok = repl({ "sta.info()", "sta.backends()", "help(sta.attention)", "print(1, nil, 'x')" },
      "STA_HISTORY=")
    assert.is_true(ok, out)
    assert.falsy(out:find("cuda: cuda:", 1, true), out)
    assert.truthy(out:find("\n  backends: [%a, ]+; cpu threads: [%w ]+; cuda: [^\n]+\n"), out)
    assert.truthy(out:find(('version = "%s"'):format(sta.info().version), 1, true), out)
    assert.truthy(out:find("sta.backends()\n{\"cpu\"", 1, true), out)
    assert.truthy(out:find("sta.attention(q, k, v, {canvas=", 1, true), out)
    assert.truthy(out:find("1\tnil\tx\n", 1, true), out)
    assert.falsy(out:find("table: 0x", 1, true), out)
  end)

  it("writes no history from piped input unless STA_HISTORY names a file", function()
    local home = H.tmp(".home")
    assert.is_true(os.execute("mkdir " .. H.quote(home)))
    local out, ok = repl({ "x = 1" }, "env -u STA_HISTORY HOME=" .. H.quote(home))
    assert.is_true(ok, out)
    assert.falsy(out:find("history in", 1, true), out)
    local f = io.open(home .. "/.sta_history")
    if f then f:close() end
    assert.is_nil(f, "piped input wrote " .. home .. "/.sta_history")
    os.remove(home)
    local hist = H.tmp(".history")
    out, ok = repl({ "y = 2" }, "STA_HISTORY=" .. H.quote(hist))
    assert.is_true(ok, out)
    assert.truthy(H.read(hist):find("y = 2", 1, true))
  end)
end)
