-- coffea-sonic's gateway (gateway.cfg): answer a refused call with its status, in the caller's protocol.
--
-- The checks in gateway.cfg set txn.grpc_status, txn.grpc_message and, over quota,
-- txn.retry_after. The whole request is read (and dropped) before the answer: HAProxy answering
-- a call whose body is still arriving resets the stream afterwards (RST_STREAM CANCEL), and a gRPC
-- client then reports CANCELLED, not the status. A gRPC call (content-type application/grpc) gets
-- a single HEADERS frame that ends the stream (HTTP 200, content-type application/grpc,
-- grpc-status, grpc-message): gRPC's trailers-only form, which every gRPC client reads as the
-- call's status. A call of Triton's HTTP/REST protocol gets the matching HTTP status and Triton's
-- error body ({"error": "..."}), with Retry-After over quota.
local HTTP_STATUS = {["7"] = 403, ["8"] = 429, ["16"] = 401}

local function is_grpc(applet)
  local types = applet.headers["content-type"]
  return types ~= nil and string.sub(types[0] or "", 1, 16) == "application/grpc"
end

local function json_string(text)
  return '"' .. string.gsub(text, '[%c"\\]', function(c)
    return string.format("\\u%04x", string.byte(c))
  end) .. '"'
end

core.register_service("grpc_refuse", "http", function(applet)
  repeat
    local chunk = applet:receive(65536)
  until chunk == nil or chunk == ""
  local status = tostring(applet:get_var("txn.grpc_status"))
  local message = applet:get_var("txn.grpc_message") or "refused"
  local retry = applet:get_var("txn.retry_after")
  if is_grpc(applet) then
    applet:set_status(200)
    applet:add_header("content-type", "application/grpc")
    applet:add_header("grpc-status", status)
    applet:add_header("grpc-message", message)
    if retry ~= nil then
      applet:add_header("retry-after", retry)
    end
    applet:start_response()
    return
  end
  local body = '{"error":' .. json_string(message) .. '}'
  applet:set_status(HTTP_STATUS[status] or 400)
  applet:add_header("content-type", "application/json")
  applet:add_header("content-length", tostring(#body))
  if retry ~= nil then
    applet:add_header("retry-after", retry)
  end
  applet:start_response()
  applet:send(body)
end)
