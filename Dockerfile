# coordstore node image: `docker build -t coordstore .`
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p coordstore-service --bin coordstore

FROM debian:bookworm-slim
RUN useradd --system --home /var/lib/coordstore coordstore \
    && mkdir -p /var/lib/coordstore && chown coordstore /var/lib/coordstore
COPY --from=build /src/target/release/coordstore /usr/local/bin/coordstore
USER coordstore
VOLUME /var/lib/coordstore
EXPOSE 7470 9470
ENTRYPOINT ["coordstore"]
CMD ["serve", "--listen", "0.0.0.0:7470", "--data-dir", "/var/lib/coordstore/data", "--metrics-listen", "0.0.0.0:9470"]
