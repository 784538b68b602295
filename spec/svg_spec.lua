local sta = require "sta"
local svg = require "sta.svg"
local H = require "helpers"

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

describe("sta.svg", function()
  after_each(H.cleanup)

  it("draws a strategy: one panel per range of equal steps, a cell per (layer, head)", function()
    local s = sta.strategy.uniform{ steps = 6, layers = 3, heads = 5, window = {3, 3, 3}, full = {5, 6, 10},
      full_steps = 2 }
    s:set(4, 1, 2, {1, 5, 7})
    local p = H.tmp(".svg")
    local text = assert(svg.strategy(s, { grid = {5, 6, 10}, path = p }))
    assert.equal(text, H.read(p))
    assert.truthy(text:match("^<svg "))
    assert.truthy(text:match("</svg>\n$"))
    -- panels: steps 0-1 (full), 2-3, 4, 5
    assert.truthy(text:find(">steps 0-1<", 1, true))
    assert.truthy(text:find(">steps 2-3<", 1, true))
    assert.truthy(text:find(">step 4<", 1, true))
    assert.truthy(text:find(">step 5<", 1, true))
    assert.equal(4 * 3 * 5, count(text, "<title>step"))
    assert.truthy(text:find("<title>step 4 layer 1 head 2: 1x5x7</title>", 1, true))
    -- legend lists each window once with its volume
    assert.truthy(text:find("3x3x3  9%", 1, true))
    assert.truthy(text:find("5x6x10  100%", 1, true))
    assert.truthy(text:find(("sparsity %.3f"):format(s:sparsity{5, 6, 10}), 1, true))
    -- the full window is yellow, the smallest window the dark end
    assert.truthy(text:find('fill="' .. svg.color(1) .. '" stroke="white" stroke-width="0.5"><title>step 0 layer 0 head 0',
      1, true))
    assert.truthy(text:find('fill="' .. svg.color(0) .. '" stroke="white" stroke-width="0.5"><title>step 2 layer 0 head 0',
      1, true))
  end)

  it("draws the key tiles of a query tile", function()
    local g = sta.geometry{ canvas = {30, 48, 80} } -- grid 5x6x10
    local text = svg.tiles(g, {4, 0, 9}, {3, 3, 5})
    local attended = count(text, 'fill="#3b528b" stroke="white"')
    assert.equal(3 * 3 * 5 - 1, attended) -- the query tile is drawn in its own colour
    assert.equal(5 * 6 * 10, count(text, 'stroke="white" stroke%-width="1"/>'))
    assert.truthy(text:find(">t tile 4<", 1, true))
    assert.truthy(text:find("45 of 300 tiles attended", 1, true))
    assert.equal(1, count(text, ">Q<"))
  end)

  it("raises the core's message for a bad window or tile", function()
    local g = sta.geometry{ canvas = {18, 24, 24} } -- grid 3x3x3
    assert.equal("window: K = 2 is even and smaller than 3 tiles", H.error_of(svg.tiles, g, {0, 0, 0}, {2, 1, 1}))
    assert.equal("window: query tile 3 outside 0..2", H.error_of(svg.tiles, g, {3, 0, 0}, {1, 1, 1}))
  end)

  -- the literal "100%%" once made the white background
  -- invalid (a transparent picture, black text lost on dark viewers)
  it("paints a white background of the whole picture", function()
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }
    for _, text in ipairs{ svg.strategy(s, { grid = {2, 2, 2} }),
                           svg.tiles(sta.geometry{ canvas = {4, 8, 8}, tile = {2, 4, 4} }, {0, 0, 0}, {1, 1, 1}) } do
      assert.truthy(text:find('<rect width="100%" height="100%" fill="white"/>', 1, true))
      assert.falsy(text:find("%%", 1, true))
    end
  end)

  it("replaces the file atomically and keeps the old one on a failed write", function()
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }
    local p = H.tmp(".svg")
    local f = assert(io.open(p, "w"))
    f:write("old picture")
    f:close()
    assert.truthy(svg.strategy(s, { grid = {2, 2, 2}, path = p }))
    assert.truthy(H.read(p):find("<svg", 1, true))
    -- a directory at the target: refused, nothing removed
    local d = H.tmp("")
    os.remove(d)
    assert.is_true(os.execute("mkdir " .. H.quote(d)))
    local none, msg = svg.strategy(s, { grid = {2, 2, 2}, path = d })
    assert.is_nil(none)
    assert.equal(d .. ": cannot open for writing: Is a directory", msg)
    local none2, msg2 = svg.strategy(s, { grid = {2, 2, 2}, path = "/nonexistent/dir/x.svg" })
    assert.is_nil(none2)
    assert.equal("/nonexistent/dir/x.svg: cannot open for writing: No such file or directory", msg2)
    assert.is_true(os.execute("rmdir " .. H.quote(d)))
  end)

  it("renders with rsvg-convert when it is installed", function()
    local _, have = H.sh("command -v rsvg-convert")
    if not have then return end
    local s = sta.strategy.uniform{ steps = 3, layers = 2, heads = 4, window = {1, 3, 3}, full = {3, 3, 3}, full_steps = 1 }
    local p, png = H.tmp(".svg"), H.tmp(".png")
    svg.strategy(s, { path = p })
    local out, ok = H.sh(("rsvg-convert %s -o %s"):format(H.quote(p), H.quote(png)))
    assert.is_true(ok, out)
    assert.equal("\137PNG", H.read(png):sub(1, 4))
    local t = H.tmp(".svg")
    svg.tiles(sta.geometry{ canvas = {7, 20, 19}, tile = {3, 8, 8} }, {1, 1, 2}, {1, 1, 3}, { path = t })
    out, ok = H.sh(("rsvg-convert %s -o %s"):format(H.quote(t), H.quote(png)))
    assert.is_true(ok, out)
  end)
end)
