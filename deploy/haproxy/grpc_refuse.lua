-- coffea-sonic's gateway (gateway.cfg): answer a refused gRPC call with its status, trailers-only.
--
-- The checks in gateway.cfg set txn.grpc_status, txn.grpc_message and, over quota,
-- txn.retry_after. The whole request is read (and dropped) before the answer: HAProxy answering
-- a call whose body is still arriving resets the stream afterwards (RST_STREAM CANCEL), and a gRPC
-- client then reports CANCELLED, not the status. The answer is a single HEADERS frame that ends
-- the stream (HTTP 200, content-type application/grpc, grpc-status, grpc-message): gRPC's
-- trailers-only form, which every gRPC client reads as the call's status.
core.register_service("grpc_refuse", "http", function(applet)
  repeat
    local chunk = applet:receive(65536)
  until chunk == nil or chunk == ""
  applet:set_status(200)
  applet:add_header("content-type", "application/grpc")
  applet:add_header("grpc-status", tostring(applet:get_var("txn.grpc_status")))
  applet:add_header("grpc-message", applet:get_var("txn.grpc_message") or "refused")
  local retry = applet:get_var("txn.retry_after")
  if retry ~= nil then
    applet:add_header("retry-after", retry)
  end
  applet:start_response()
end)
