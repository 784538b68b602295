local sta = require "sta"
local H = require "helpers"

describe("sta geometry", function()
  it("computes the tile grid, partial border tiles included", function()
    local g = sta.geometry{ canvas = {30, 48, 80} }
    assert.same({5, 6, 10}, g:grid())
    assert.same({6, 8, 8}, g.tile)
    assert.equal(115200, g:video_tokens())
    local odd = sta.geometry{ canvas = {7, 9, 17}, tile = {3, 4, 8} }
    assert.same({3, 3, 3}, odd:grid())
    assert.equal(7 * 9 * 17, odd:video_tokens())
    assert.equal("sta.Geometry(canvas 7x9x17, tile 3x4x8, grid 3x3x3, text_len -1)", tostring(odd))
  end)

  it("resolves text length: default S - V, explicit otherwise", function()
    local g = sta.geometry{ canvas = {2, 4, 4} }
    assert.equal(10, g:text_len_for(42))
    local g2 = sta.geometry{ canvas = {2, 4, 4}, text_len = 3 }
    assert.equal(3, g2:text_len_for(42))
  end)

  it("clamps windows inward at the borders (STA.md section 2)", function()
    -- C = 5 tiles, K = 3: q=0 -> 0..2, q=2 -> 1..3, q=4 -> 2..4
    assert.same({0, 3}, { sta.window_range(0, 3, 5) })
    assert.same({1, 3}, { sta.window_range(2, 3, 5) })
    assert.same({2, 3}, { sta.window_range(4, 3, 5) })
    assert.same({0, 5}, { sta.window_range(3, 7, 5) })
    assert.same({0, 4}, { sta.window_range(1, 4, 4) })
    assert.equal("window: K = 2 is even and smaller than 5 tiles",
      H.error_of(sta.window_range, 1, 2, 5))
    assert.equal("window: K = 0, expected >= 1", H.error_of(sta.window_range, 1, 0, 5))
  end)

  it("lists the key tiles of a query tile", function()
    local g = sta.geometry{ canvas = {12, 16, 16}, tile = {6, 8, 8} }
    local tiles = g:key_tiles({0, 0, 0}, {1, 1, 1})
    assert.same({{0, 0, 0}}, tiles)
    local g2 = sta.geometry{ canvas = {18, 32, 40}, tile = {6, 8, 8} } -- grid 3x4x5
    local t2 = g2:key_tiles({2, 3, 0}, {3, 3, 3})
    assert.equal(27, #t2)
    assert.same({0, 1, 0}, t2[1])
    assert.same({2, 3, 2}, t2[27])
  end)

  it("rejects bad canvases, tiles, windows and text lengths exactly", function()
    assert.equal("canvas[2]: expected a 32-bit integer >= 1, got 0", H.error_of(sta.geometry, { canvas = {4, 0, 4} }))
    assert.equal("tile: w = 0, expected 1..1048576",
      H.error_of(sta.geometry, { canvas = {4, 4, 4}, tile = {1, 1, 0} }))
    assert.equal("canvas: expected 3 integers, got 2", H.error_of(sta.geometry, { canvas = {4, 4} }))
    assert.equal("canvas: expected {T, H, W}, got nil", H.error_of(sta.geometry, {}))
    local g = sta.geometry{ canvas = {12, 16, 16} } -- grid 2x2x2
    assert.equal("seq_len 100 not supported for STA", H.error_of(g.check, g, 100))
    assert.is_true(g:window_check({2, 2, 2}))
    assert.is_true(g:window_check({1, 1, 1}))
    local g3 = sta.geometry{ canvas = {18, 24, 24} } -- grid 3x3x3
    assert.equal("window: Kh = 2 is even and smaller than the 3 tiles on the h axis "
      .. "(use an odd window, or >= 3 for the whole axis)", H.error_of(g3.window_check, g3, {1, 2, 1}))
    local g4 = sta.geometry{ canvas = {2, 4, 4}, text_len = 5 }
    assert.equal("text_len: 5 is outside 0..2 (seq_len 34 - 32 video tokens)",
      H.error_of(g4.check, g4, 34))
  end)

  it("knows FastVideo's shapes by sequence length", function()
    assert.same({30, 48, 80}, sta.geometry_from_seq_len(115456).canvas)
    assert.same({36, 48, 48}, sta.geometry_from_seq_len(82944).canvas)
    assert.same({18, 48, 80}, sta.geometry_from_seq_len(69120).canvas)
    assert.equal("seq_len 1234 not supported for STA", H.error_of(sta.geometry_from_seq_len, 1234))
  end)

  it("knows the rows of the tiled order", function()
    local g = sta.geometry{ canvas = {3, 5, 6}, tile = {2, 2, 4}, order = "tiled" }
    assert.equal("tiled", g.order)
    assert.equal(192, g:video_rows()) -- 2x3x2 tiles of 16, partial ones padded
    assert.equal(90, g:video_tokens())
    assert.equal(4, g:text_len_for(196))
    assert.is_true(g:check(196))
    assert.equal("seq_len 94 not supported for STA (the tiled order of canvas 3x5x6 has 192 "
      .. "video rows: 2x3x2 tiles of 2x2x4, partial ones padded; then the text)",
      H.error_of(g.check, g, 94))
    assert.equal("untiled", sta.geometry{ canvas = {3, 5, 6} }.order)
    assert.equal(90, sta.geometry{ canvas = {3, 5, 6} }:video_rows())
    assert.matches("tiled order", tostring(g))
    assert.equal("order: expected \"untiled\" or \"tiled\", got 'zigzag'",
      H.error_of(sta.geometry, { canvas = {3, 5, 6}, order = "zigzag" }))
  end)

  it("tiles and untiles back to the same tensor", function()
    local g = sta.geometry{ canvas = {3, 5, 6}, tile = {2, 2, 4} } -- partial tiles
    local S = 3 * 5 * 6 + 4
    local x = H.randn({1, S, 2, 8})
    local tiled = sta.tile(x, g)
    assert.equal(g:tiled_len(S), tiled:size(2))
    assert.equal(2 * 3 * 2 * 16 + 4, g:tiled_len(S))
    local back = sta.untile(tiled, g, S)
    assert.is_true(H.same_values(x, back))
    -- FastVideo order: token (t=0,h=0,w=4) is the first of tile (0,0,1)
    assert.equal(x:get{1, 5, 1, 1}, tiled:get{1, 16 + 1, 1, 1})
  end)
end)
